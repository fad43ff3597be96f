//! `[tools]`: settings of the built-in tools that need any.

use crate::{Check, ConfigError, is_http_url};
use serde::{Deserialize, Serialize};

/// `[tools]`: settings of built-in tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolSettings {
    /// SQLite database (a path, or `sqlite::memory:`) that the read-only `general_query`
    /// tool queries; unset: the tool is not offered. Env: `TOOLGRAPH_TOOLS_SQL_DATABASE`.
    pub sql_database: Option<String>,
    /// The course tutor's `get_guia` (the teaching guides `toolgraph guides import` stores) and
    /// `generate_test`; absent: not offered. `[tools.course]` alone turns them on.
    pub course: Option<CourseToolSettings>,
}

/// `[tools.course]`: the course tutor's tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CourseToolSettings {
    /// The backend that keeps the professors' test preferences: `generate_test` reads
    /// `GET {backend_url}/users/subject/{asignatura}/preferences` (5 s), else uses 5 questions
    /// of medium difficulty. Env: `TOOLGRAPH_TOOLS_COURSE_BACKEND_URL`.
    pub backend_url: Option<String>,
}

impl ToolSettings {
    pub(crate) fn validate(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        if let Some(url) = self.course.as_ref().and_then(|c| c.backend_url.as_deref())
            && !is_http_url(Some(url))
        {
            return Err(check.invalid("tools.course.backend_url", format!("'{url}' is not an http(s) URL")));
        }
        Ok(())
    }
}
