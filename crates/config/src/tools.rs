//! `[tools]`: settings of the built-in tools that need any.

use serde::{Deserialize, Serialize};

/// `[tools]`: settings of built-in tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolSettings {
    /// SQLite database (a path, or `sqlite::memory:`) that the read-only `general_query`
    /// tool queries; unset: the tool is not offered. Env: `TOOLGRAPH_TOOLS_SQL_DATABASE`.
    pub sql_database: Option<String>,
}
