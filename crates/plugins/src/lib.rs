//! Plugins: tools declared in a directory instead of compiled in.
//!
//! Owns: finding plugins (every `plugin.toml` below the configured directories), reading and
//! checking their manifests ([`manifest`]: errors name the file, the line and the field, and a
//! broken plugin never stops the others), choosing the newest of two versions of one name,
//! resolving `$t:key` display text from the plugin's locale files, and running them as tools
//! — `exec` plugins as a program without a shell ([`exec`]: JSON in on stdin, JSON out on
//! stdout, killed with its process group past its time limit, an environment cleared but for
//! an allow-list) and `http` plugins as one request ([`http`]), each a [`tool::PluginTool`];
//! `mcp` plugins, an MCP server's tools through one long-lived session ([`mcp_client`]); and
//! toolgraph as an MCP server ([`mcp_server`]).
//!
//! Does not own: approval of write plugins (the graph pauses for it, as for every write tool)
//! or where the tools go (the agents crate registers them).
//!
//! ```no_run
//! # async fn demo() {
//! let loaded = toolgraph_plugins::load_all(&["examples/plugins".into()], "en").await;
//! for p in &loaded.plugins {
//!     println!("loaded plugin {} {} from {}", p.name, p.version, p.dir.display());
//! }
//! for e in &loaded.errors {
//!     eprintln!("{e}");
//! }
//! # }
//! ```
#![warn(missing_docs)]

pub mod exec;
pub mod http;
pub mod manifest;
pub mod mcp_client;
pub mod mcp_server;
mod template;
pub mod tool;

pub use manifest::{Class, Kind, Manifest, ManifestError};

use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use toolgraph_tools::{ParamDisplay, Tool, ToolClass, ToolDisplay, ToolRegistry, ToolSet, ToolSpec};

/// A plugin that loaded.
#[derive(Clone)]
pub struct LoadedPlugin {
    /// Its name (the tool's; an MCP server's tools are named after it).
    pub name: String,
    /// Its version.
    pub version: semver::Version,
    /// How it runs.
    pub kind: Kind,
    /// Its directory.
    pub dir: PathBuf,
    /// Its tools when it loaded: one, or an MCP server's.
    pub tools: Vec<Arc<dyn Tool>>,
    /// An MCP server's tools as they change while it runs (enabled as a whole by the plugin's
    /// name); `None` for the other kinds.
    pub set: Option<Arc<ToolSet>>,
}

impl LoadedPlugin {
    /// Adds the plugin's tools to `registry`: an MCP server's as a set that follows the
    /// server, the others one by one.
    ///
    /// # Errors
    /// A name already taken.
    pub fn register_into(&self, registry: &mut ToolRegistry) -> Result<(), toolgraph_tools::RegistryError> {
        match &self.set {
            Some(set) => registry.register_set(Arc::clone(set)),
            None => self.tools.iter().try_for_each(|t| registry.register(Arc::clone(t))),
        }
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("kind", &self.kind)
            .field("dir", &self.dir)
            .finish()
    }
}

/// A plugin passed over because a newer version of the same name loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseded {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: semver::Version,
    /// Its directory.
    pub dir: PathBuf,
    /// The version that loaded instead.
    pub by: semver::Version,
}

/// What [`load`] found: the plugins that loaded (sorted by name), the older versions passed
/// over, and one error per plugin that could not load.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Ready to register.
    pub plugins: Vec<LoadedPlugin>,
    /// Older versions of loaded plugins.
    pub superseded: Vec<Superseded>,
    /// Plugins that did not load, each with the reason.
    pub errors: Vec<ManifestError>,
    /// MCP servers found by [`load`], connected by [`load_all`].
    mcp: Vec<(Manifest, PathBuf, PathBuf)>,
}

/// [`load`], then connects to the MCP servers it found (concurrently, each within its time
/// limit), whose tools join the plugins. Run from async code: the directory reading goes to a
/// blocking thread.
pub async fn load_all(dirs: &[PathBuf], locale: &str) -> Loaded {
    let (dirs, locale) = (dirs.to_vec(), locale.to_owned());
    let mut loaded = match tokio::task::spawn_blocking(move || load(&dirs, &locale)).await {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::error!(error = %e, "the plugin loader failed");
            return Loaded::default();
        }
    };
    let servers = std::mem::take(&mut loaded.mcp);
    let connected = futures::future::join_all(servers.into_iter().map(|(m, dir, path)| async move {
        let spec = m.mcp.clone();
        let result = match &spec {
            Some(spec) => mcp_client::connect(&m, spec, &dir).await,
            None => Err(error(&path, Some("mcp"), "kind \"mcp\" needs an [mcp] table".into())),
        };
        (m, dir, path, result)
    }))
    .await;
    for (m, dir, path, result) in connected {
        match result {
            Ok(set) => {
                let tools = set.members().to_vec();
                tracing::info!(
                    "loaded plugin {} {} from {} (MCP: {} tools)",
                    m.name,
                    m.version,
                    dir.display(),
                    tools.len()
                );
                loaded.plugins.push(LoadedPlugin {
                    name: m.name.clone(),
                    version: m.semver(),
                    kind: Kind::Mcp,
                    dir,
                    tools,
                    set: Some(set),
                });
            }
            Err(mut e) => {
                e.path = path;
                tracing::error!("plugin not loaded: {e}");
                loaded.errors.push(e);
            }
        }
    }
    loaded.plugins.sort_by(|a, b| a.name.cmp(&b.name));
    loaded
}

/// Finds and loads every plugin below `dirs` (searched recursively), resolving `$t:key`
/// display text from each plugin's `locales/<locale>.json`; MCP servers are found but not
/// connected (see [`load_all`]). Reads files: call it from a blocking context.
pub fn load(dirs: &[PathBuf], locale: &str) -> Loaded {
    let mut loaded = Loaded::default();
    let mut found: Vec<(Manifest, PathBuf, PathBuf)> = Vec::new();
    for path in manifests(dirs, &mut loaded.errors) {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                loaded.errors.push(error(&path, None, format!("cannot read it: {e}")));
                continue;
            }
        };
        match Manifest::parse(&path, &text) {
            Ok(m) => {
                let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
                found.push((m, dir, path));
            }
            Err(e) => loaded.errors.push(e),
        }
    }
    // Of one name, the newest version loads; the same version twice is a conflict.
    let mut by_name: BTreeMap<String, Vec<(Manifest, PathBuf, PathBuf)>> = BTreeMap::new();
    for entry in found {
        by_name.entry(entry.0.name.clone()).or_default().push(entry);
    }
    for (name, mut versions) in by_name {
        versions.sort_by(|a, b| b.0.semver().cmp(&a.0.semver()).then_with(|| a.2.cmp(&b.2)));
        let mut versions = versions.into_iter();
        let Some((newest, dir, path)) = versions.next() else { continue };
        let newest_version = newest.semver();
        let mut conflict = false;
        for (other, other_dir, other_path) in versions {
            if other.semver() == newest_version {
                conflict = true;
                let message = format!("plugin `{name}` {newest_version} is also at {}", path.display());
                loaded.errors.push(ManifestError {
                    path: other_path,
                    line: None,
                    field: Some("version".into()),
                    message: format!("{message}: two plugins of one name need different versions"),
                });
            } else {
                loaded.superseded.push(Superseded {
                    name: name.clone(),
                    version: other.semver(),
                    dir: other_dir,
                    by: newest_version.clone(),
                });
            }
        }
        if conflict {
            loaded.errors.push(error(
                &path,
                Some("version"),
                format!("plugin `{name}` {newest_version} is not unique"),
            ));
            continue;
        }
        if newest.kind == Kind::Mcp {
            loaded.mcp.push((newest, dir, path));
            continue;
        }
        match tool(&newest, &dir, locale) {
            Ok(tool) => loaded.plugins.push(LoadedPlugin {
                name,
                version: newest_version,
                kind: newest.kind,
                dir,
                tools: vec![tool],
                set: None,
            }),
            Err(mut e) => {
                e.path = path;
                loaded.errors.push(e);
            }
        }
    }
    for p in &loaded.plugins {
        tracing::info!("loaded plugin {} {} from {}", p.name, p.version, p.dir.display());
    }
    for e in &loaded.errors {
        tracing::error!("plugin not loaded: {e}");
    }
    loaded
}

/// Every `plugin.toml` below `dirs`, in path order; an unreadable directory is an error.
fn manifests(dirs: &[PathBuf], errors: &mut Vec<ManifestError>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        // Links are followed (a plugin may be a link to its checkout); walkdir reports loops.
        for entry in walkdir::WalkDir::new(dir).follow_links(true).sort_by_file_name() {
            match entry {
                Ok(e) if e.file_type().is_file() && e.file_name() == manifest::MANIFEST => out.push(e.into_path()),
                Ok(_) => {}
                Err(e) => {
                    let path = e.path().map_or_else(|| dir.clone(), Path::to_path_buf);
                    errors.push(error(&path, None, format!("cannot read it: {e}")));
                }
            }
        }
    }
    out
}

fn error(path: &Path, field: Option<&str>, message: String) -> ManifestError {
    ManifestError { path: path.to_owned(), line: None, field: field.map(str::to_owned), message }
}

/// The tool a manifest describes.
fn tool(m: &Manifest, dir: &Path, locale: &str) -> Result<Arc<dyn Tool>, ManifestError> {
    let strings = locale_strings(dir, locale)?;
    let text = |v: &Option<String>| v.as_deref().map(|t| resolve(t, &strings));
    let display = ToolDisplay {
        name: text(&m.display_name),
        description: text(&m.display_description),
        parameters: m
            .parameters
            .iter()
            .filter_map(|(name, p)| {
                text(&p.display_description).map(|d| (name.clone(), ParamDisplay { description: d }))
            })
            .collect(),
    };
    let spec = ToolSpec {
        name: m.name.clone(),
        description: m.description.clone(),
        class: match m.class {
            Class::Read => ToolClass::Read,
            Class::Write => ToolClass::Write,
        },
        parameters: m.schema(),
        injected: Vec::new(),
        offered_after: Vec::new(),
        required_after: Vec::new(),
        runs_after: Vec::new(),
        answer_field: None,
        cited_as: None,
        display,
    };
    let schema = toolgraph_tools::ArgumentSchema::from_value(&m.name, spec.parameters.clone(), &[])
        .map_err(|e| error(dir, Some("parameters"), e.to_string()))?;
    let common = tool::Common { spec, schema, describe: m.describe.clone(), timeout_ms: m.timeout_ms };
    match (m.kind, &m.exec, &m.http) {
        (Kind::Exec, Some(spec), _) => {
            Ok(Arc::new(tool::PluginTool::new(common, exec::ExecRunner::new(dir, spec, &m.env)?)))
        }
        (Kind::Http, _, Some(spec)) => {
            let runner = http::HttpRunner::new(common.limit(), spec)?;
            Ok(Arc::new(tool::PluginTool::new(common, runner)))
        }
        // Checked when the manifest was parsed.
        _ => Err(error(dir, Some("kind"), "the plugin's kind has no table here".into())),
    }
}

/// The plugin's display strings for `locale`: `locales/<locale>.json`, a flat object of keys
/// and texts; none when the file does not exist.
fn locale_strings(dir: &Path, locale: &str) -> Result<Map<String, Value>, ManifestError> {
    let path = dir.join("locales").join(format!("{locale}.json"));
    match std::fs::read_to_string(&path) {
        Ok(text) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(error(&path, None, "a locale file is a JSON object of keys and texts".into())),
            Err(e) => Err(ManifestError { path, line: Some(e.line()), field: None, message: e.to_string() }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Map::new()),
        Err(e) => Err(error(&path, None, format!("cannot read it: {e}"))),
    }
}

/// `$t:key` → the locale's text for `key`, falling back to the key; other text as it is.
fn resolve(text: &str, strings: &Map<String, Value>) -> String {
    match text.strip_prefix("$t:") {
        Some(key) => strings.get(key).and_then(Value::as_str).unwrap_or(key).to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn display_keys_resolve_or_fall_back_to_the_key() {
        let strings = json!({"calc.name": "Calculadora"}).as_object().cloned().unwrap();
        assert_eq!(resolve("$t:calc.name", &strings), "Calculadora");
        assert_eq!(resolve("$t:calc.missing", &strings), "calc.missing");
        assert_eq!(resolve("Plain", &strings), "Plain");
    }

    #[test]
    fn describe_templates_take_the_arguments() {
        let args = json!({"to": "+34600", "count": 3});
        let fill = toolgraph_tools::describe::fill_describe;
        assert_eq!(fill("Send {count} SMS to {to}", &args), "Send 3 SMS to +34600");
    }
}
