//! The offline directory of crisis lines: the fallback when web search is unavailable or finds
//! nothing. A JSON file of regions, each with the names it is known by and its lines, each line
//! with its source and when it was checked (docs/crisis.md).

use super::Resource;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The directory shipped in the binary (`crates/agents/data/crisis-hotlines.json`).
const SHIPPED: &str = include_str!("../../data/crisis-hotlines.json");

/// One line of the directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The service.
    pub name: String,
    /// Its number (may be empty for a web service).
    #[serde(default)]
    pub phone: String,
    /// Its web address (may be empty).
    #[serde(default)]
    pub url: String,
    /// Where the entry was taken from.
    pub source: String,
    /// When someone last checked it against the source.
    pub checked: String,
}

/// A region and its lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// The region's name, as results show it.
    pub region: String,
    /// Lowercase names a location may use for it.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Its lines.
    pub resources: Vec<Entry>,
}

/// The directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Directory {
    /// What the file is; for people.
    #[serde(default)]
    pub about: String,
    /// The region whose lines answer when a location matches none.
    pub fallback_region: String,
    /// The regions.
    pub regions: Vec<Region>,
}

/// A directory that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("crisis line directory {path}: {reason}")]
pub struct DirectoryError {
    path: String,
    reason: String,
}

impl Directory {
    /// The shipped directory.
    pub fn shipped() -> Self {
        // The shipped file is checked by a unit test.
        serde_json::from_str(SHIPPED).expect("the shipped crisis line directory is valid JSON")
    }

    /// The directory in `path`.
    ///
    /// # Errors
    /// An unreadable file, invalid JSON, or a fallback region that is not among the regions.
    pub fn load(path: &Path) -> Result<Self, DirectoryError> {
        let err = |reason: String| DirectoryError { path: path.display().to_string(), reason };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let dir: Self = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if !dir.regions.iter().any(|r| r.region == dir.fallback_region) {
            return Err(err(format!("fallback_region '{}' is not one of the regions", dir.fallback_region)));
        }
        Ok(dir)
    }

    /// The lines for `location` (a country or city as the user gave it), at most `limit`: the
    /// region whose name or an alias the location names, else the fallback region's.
    pub fn lookup(&self, location: &str, limit: usize) -> Vec<Resource> {
        let wanted = location.trim().to_lowercase();
        let matches = |r: &&Region| {
            !wanted.is_empty()
                && (r.region.to_lowercase() == wanted
                    || r.aliases.iter().any(|a| a == &wanted || contains_word(&wanted, a)))
        };
        let region = self
            .regions
            .iter()
            .find(matches)
            .or_else(|| self.regions.iter().find(|r| r.region == self.fallback_region));
        region
            .map(|r| {
                r.resources
                    .iter()
                    .take(limit)
                    .map(|e| Resource {
                        name: e.name.clone(),
                        phone: e.phone.clone(),
                        url: e.url.clone(),
                        region: r.region.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Whether `word` occurs in `text` as whole words ("uk" in "london, uk", not in "ukraine").
fn contains_word(text: &str, word: &str) -> bool {
    crate::words::positions(text, word).next().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_directory_is_valid_and_every_entry_names_its_source() {
        let dir = Directory::shipped();
        assert!(dir.regions.iter().any(|r| r.region == dir.fallback_region));
        for r in &dir.regions {
            for e in &r.resources {
                assert!(!e.source.is_empty() && !e.checked.is_empty(), "{}: {e:?}", r.region);
                assert!(!e.phone.is_empty() || !e.url.is_empty(), "{}: {e:?}", r.region);
            }
        }
    }

    #[test]
    fn a_location_finds_its_region_by_name_or_alias_else_the_fallback() {
        let dir = Directory::shipped();
        assert_eq!(dir.lookup("Singapore", 5)[0].phone, "1767");
        assert_eq!(dir.lookup("London, UK", 5)[0].region, "United Kingdom");
        assert_eq!(dir.lookup("Ukraine", 5)[0].region, "International", "'uk' is not a word of 'ukraine'");
        assert_eq!(dir.lookup("", 5)[0].region, "International");
        assert_eq!(dir.lookup("Granada", 1).len(), 1);
    }

    #[test]
    fn a_bad_directory_file_is_refused_with_its_path() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("d.json");
        std::fs::write(&path, r#"{"fallback_region": "X", "regions": []}"#).unwrap();
        let err = Directory::load(&path).unwrap_err().to_string();
        assert!(err.contains("d.json") && err.contains("fallback_region 'X'"), "{err}");
        std::fs::write(&path, "{").unwrap();
        assert!(Directory::load(&path).is_err());
    }
}
