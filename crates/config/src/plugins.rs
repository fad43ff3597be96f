//! `[plugins]`: where plugins are found and which language their display text is shown in.

use crate::{Check, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[plugins]`: tools declared in directories (`plugin.toml` each, searched recursively).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginSettings {
    /// Directories searched for plugins, recursively. Default: none.
    /// Env: `TOOLGRAPH_PLUGINS_DIRS` (a TOML array, e.g. `["plugins"]`).
    pub dirs: Vec<PathBuf>,
    /// The locale of the plugins' display text (`locales/<locale>.json` in each plugin).
    /// Default: `en`. Env: `TOOLGRAPH_PLUGINS_LOCALE`.
    pub locale: String,
}

impl Default for PluginSettings {
    fn default() -> Self {
        Self { dirs: Vec::new(), locale: "en".into() }
    }
}

impl PluginSettings {
    pub(crate) fn validate(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        let ok = !self.locale.is_empty()
            && self.locale.len() <= 16
            && self.locale.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(
                check.invalid("plugins.locale", format!("'{}' is not a locale name such as en or pt-BR", self.locale))
            );
        }
        Ok(())
    }
}
