//! `plugin.toml`: what a plugin declares — its name, required semver version, the text the
//! model and people read, its parameters (which become the tool's JSON Schema), its class,
//! time limit and environment allow-list, and how it runs (`exec` or `http`). Parsing is
//! strict: an unknown key, a bad value or a missing required field is an error that names the
//! file, the line and the field.

use crate::template::{context_references, env_references};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file name a plugin directory holds.
pub const MANIFEST: &str = "plugin.toml";

/// Longest a plugin may ask to run, in milliseconds (10 minutes).
const MAX_TIMEOUT_MS: u64 = 600_000;

/// A manifest as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The tool name the model calls (`^[a-zA-Z0-9_-]{1,64}$`).
    pub name: String,
    /// A semver version; of two plugins with one name, the newer loads.
    pub version: String,
    /// What the tool does, written for the model.
    pub description: String,
    /// Name shown to people (may be a `$t:key` of the plugin's locale files).
    #[serde(rename = "displayName", default)]
    pub display_name: Option<String>,
    /// Description shown to people (may be a `$t:key`).
    #[serde(rename = "displayDescription", default)]
    pub display_description: Option<String>,
    /// `read` (runs when the model asks) or `write` (pauses for a person's approval). Default:
    /// `read`.
    #[serde(default)]
    pub class: Class,
    /// Longest one call may run, in milliseconds; the plugin is stopped past it. Default: 30000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Environment variables passed to an `exec` plugin (everything else is cleared) and
    /// usable as `${NAME}` in an `http` plugin's headers. Default: none.
    #[serde(default)]
    pub env: Vec<String>,
    /// For a write plugin: the action as a person reads it before approving, `{param}` filled
    /// from the arguments. Default: "Run NAME with ARGUMENTS".
    #[serde(default)]
    pub describe: Option<String>,
    /// The arguments the model supplies, by name.
    #[serde(default)]
    pub parameters: BTreeMap<String, Parameter>,
    /// How the plugin runs.
    pub kind: Kind,
    /// `kind = "exec"`: the program.
    #[serde(default)]
    pub exec: Option<ExecSpec>,
    /// `kind = "http"`: the request.
    #[serde(default)]
    pub http: Option<HttpSpec>,
    /// `kind = "mcp"`: the server.
    #[serde(default)]
    pub mcp: Option<McpSpec>,
}

/// `[mcp]`: an MCP server whose tools join toolgraph's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSpec {
    /// A server on stdio: its program (a path relative to the plugin's directory, or a name
    /// looked up in `PATH`).
    #[serde(default)]
    pub command: Option<PathBuf>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// A stdio server's environment beyond the variables `env` passes on: name → value, each
    /// value a template (`${NAME}` from toolgraph's environment, `{ctx.KEY}` from the turn).
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// A server over streamable HTTP: its endpoint (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// An HTTP server's request headers: name → template (`${NAME}` from toolgraph's
    /// environment, listed in `env`; `{ctx.KEY}` from the turn, e.g. the user it acts for).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Most sessions kept at once. Values filled from the turn (`{ctx.KEY}`) open one session
    /// per distinct set of values — one per user, say — and past this many the least recently
    /// used one is closed. Default: 16.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Put before each of the server's tool names. Default: the plugin's name and `_`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// The server's tools that run without a person's approval (read tools); every other tool
    /// of the server pauses for approval, whatever hints the server gives. Default: none.
    #[serde(default)]
    pub read_tools: Vec<String>,
}

fn default_max_sessions() -> usize {
    16
}

fn default_timeout_ms() -> u64 {
    30_000
}

/// A tool class as a manifest writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Runs as soon as the model asks.
    #[default]
    Read,
    /// Pauses for a person's approval first.
    Write,
}

/// How a plugin runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A program, without a shell: the arguments as JSON on stdin, the result as JSON on stdout.
    Exec,
    /// An HTTP request built from the arguments; the response (or a part of it) is the result.
    Http,
    /// An MCP server's tools, through a long-lived session.
    Mcp,
}

/// One parameter: its JSON type and the text the model and people read.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parameter {
    /// `string`, `number`, `integer`, `boolean`, `array` or `object`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What it means, for the model.
    pub description: String,
    /// What it means, for people (may be a `$t:key`).
    #[serde(rename = "displayDescription", default)]
    pub display_description: Option<String>,
    /// Whether the model must supply it. Default: false.
    #[serde(default)]
    pub required: bool,
    /// The only values allowed.
    #[serde(rename = "enum", default)]
    pub allowed: Option<Vec<Value>>,
    /// Least value (numbers).
    #[serde(default)]
    pub minimum: Option<f64>,
    /// Greatest value (numbers).
    #[serde(default)]
    pub maximum: Option<f64>,
    /// Type of the items (arrays). Default: any.
    #[serde(default)]
    pub items: Option<String>,
}

/// `[exec]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    /// The program: a path relative to the plugin's directory, or absolute. Run directly, never
    /// through a shell.
    pub command: PathBuf,
    /// Fixed arguments.
    #[serde(default)]
    pub args: Vec<String>,
}

/// `[http]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`. Default: `POST`.
    #[serde(default = "default_method")]
    pub method: String,
    /// The URL; `{param}` is replaced by that argument, percent-encoded (in the path or the query
    /// only; in the path as one segment that is never `.` or `..`).
    pub url: String,
    /// Headers; `${NAME}` is replaced by environment variable `NAME` (listed in `env`), so
    /// secrets live in the environment, never in the manifest.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Send the arguments not used in the URL as a JSON body. Default: true for `POST`, `PUT`
    /// and `PATCH`.
    #[serde(default)]
    pub body: Option<bool>,
    /// A JSON pointer into the response that is the result (e.g. `/data/0`). Default: the
    /// whole response.
    #[serde(default)]
    pub result: Option<String>,
}

fn default_method() -> String {
    "POST".into()
}

/// A manifest that cannot be used: which file, where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{}: {message}", .path.display(), .line.map(|l| format!(":{l}")).unwrap_or_default(), .field.as_ref().map(|f| format!(": field `{f}`")).unwrap_or_default())]
pub struct ManifestError {
    /// The manifest file.
    pub path: PathBuf,
    /// The 1-based line the problem is on, when known.
    pub line: Option<usize>,
    /// The field, when one is at fault.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl Manifest {
    /// Parses and checks the manifest text of `path`.
    ///
    /// # Errors
    /// [`ManifestError`] naming the line and field of the first problem.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ManifestError> {
        let manifest: Manifest = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start));
            let message = e.message().to_owned();
            let field = field_named(&message).or_else(|| line.and_then(|l| key_on_line(text, l)));
            ManifestError { path: path.to_owned(), line, field, message }
        })?;
        manifest.check(path, text)?;
        Ok(manifest)
    }

    /// The checks the types cannot make.
    fn check(&self, path: &Path, text: &str) -> Result<(), ManifestError> {
        let fail = |field: &str, message: String| ManifestError {
            path: path.to_owned(),
            line: find_key(text, field),
            field: Some(field.to_owned()),
            message,
        };
        // A header or environment value: its variables listed in `env`, its context keys named.
        let check_template = |field: &str, value: &str| {
            if let Some(var) = env_references(value).find(|var| !self.env.iter().any(|e| e == var)) {
                return Err(fail(field, format!("${{{var}}} is not listed in `env`")));
            }
            if context_references(value).any(str::is_empty) {
                return Err(fail(field, "{ctx.} names no context key".into()));
            }
            Ok(())
        };
        if !toolgraph_tools::valid_tool_name(&self.name) {
            return Err(fail("name", format!("'{}' is not a tool name (1-64 of a-z, A-Z, 0-9, _ and -)", self.name)));
        }
        semver::Version::parse(&self.version)
            .map_err(|e| fail("version", format!("'{}' is not a semver version: {e}", self.version)))?;
        if self.description.trim().is_empty() {
            return Err(fail("description", "the model needs a description".into()));
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(fail("timeout_ms", format!("{} is outside 1..={MAX_TIMEOUT_MS}", self.timeout_ms)));
        }
        for (name, p) in &self.parameters {
            let field = format!("parameters.{name}");
            if !matches!(p.kind.as_str(), "string" | "number" | "integer" | "boolean" | "array" | "object") {
                return Err(fail(&field, format!("type '{}' is not a JSON type", p.kind)));
            }
            if p.items.as_deref().is_some_and(|i| !matches!(i, "string" | "number" | "integer" | "boolean" | "object"))
            {
                return Err(fail(&field, "items must be a JSON type".into()));
            }
            if p.description.trim().is_empty() {
                return Err(fail(&field, "the model needs a description".into()));
            }
        }
        let (exec, http, mcp) = (self.exec.is_some(), self.http.is_some(), self.mcp.is_some());
        match self.kind {
            Kind::Exec if !exec => return Err(fail("exec", "kind \"exec\" needs an [exec] table".into())),
            Kind::Http if !http => return Err(fail("http", "kind \"http\" needs an [http] table".into())),
            Kind::Mcp if !mcp => return Err(fail("mcp", "kind \"mcp\" needs an [mcp] table".into())),
            _ => {}
        }
        if usize::from(exec) + usize::from(http) + usize::from(mcp) > 1 {
            return Err(fail("kind", "a plugin has one of [exec], [http] or [mcp], not several".into()));
        }
        if let Some(m) = &self.mcp {
            if !self.parameters.is_empty() {
                return Err(fail("parameters", "an MCP server's tools bring their own parameters".into()));
            }
            match (&m.command, &m.url) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(fail("mcp", "a server has either a command (stdio) or a url".into()));
                }
                (None, Some(url)) => {
                    if !url::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https")) {
                        return Err(fail("mcp.url", format!("'{url}' is not an http(s) URL")));
                    }
                    if !m.environment.is_empty() {
                        return Err(fail("mcp.environment", "an HTTP server gets headers, not an environment".into()));
                    }
                }
                (Some(_), None) => {
                    if !m.headers.is_empty() {
                        return Err(fail("mcp.headers", "a stdio server gets an environment, not headers".into()));
                    }
                }
            }
            if !(1..=1024).contains(&m.max_sessions) {
                return Err(fail("mcp.max_sessions", format!("{} is not in 1..=1024", m.max_sessions)));
            }
            for (header, value) in &m.headers {
                let field = format!("mcp.headers.{header}");
                if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                    return Err(fail(&field, "not a header name".into()));
                }
                // The transport sets these itself.
                const RESERVED: [&str; 5] =
                    ["accept", "content-type", "mcp-session-id", "mcp-protocol-version", "last-event-id"];
                if RESERVED.iter().any(|r| header.eq_ignore_ascii_case(r)) {
                    return Err(fail(&field, "the MCP transport sets this header itself".into()));
                }
                check_template(&field, value)?;
            }
            for (name, value) in &m.environment {
                let field = format!("mcp.environment.{name}");
                if name.is_empty() || name.contains(['=', '\0']) {
                    return Err(fail(&field, "not an environment variable name".into()));
                }
                check_template(&field, value)?;
            }
            let bad_prefix = |p: &str| !p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if m.prefix.as_deref().is_some_and(bad_prefix) {
                return Err(fail("mcp.prefix", "a prefix uses a-z, A-Z, 0-9, _ and -".into()));
            }
        }
        if let Some(h) = &self.http {
            if !matches!(h.method.as_str(), "GET" | "POST" | "PUT" | "PATCH" | "DELETE") {
                return Err(fail("http.method", format!("'{}' is not GET, POST, PUT, PATCH or DELETE", h.method)));
            }
            for placeholder in placeholders(&h.url) {
                if !self.parameters.contains_key(placeholder) {
                    return Err(fail("http.url", format!("{{{placeholder}}} is not a parameter")));
                }
            }
            // The model fills placeholders, so none may sit in the scheme or the authority: it
            // would pick the server the plugin's headers (its secrets) are sent to.
            let authority_start = h.url.find("://").map_or(0, |i| i + 3);
            let authority_end =
                h.url[authority_start..].find(['/', '?', '#']).map_or(h.url.len(), |i| authority_start + i);
            if h.url[..authority_end].contains('{') {
                return Err(fail(
                    "http.url",
                    format!("'{}' has a placeholder before its path: the server is the manifest's to name", h.url),
                ));
            }
            let url = h.url.replace(['{', '}'], "");
            match url::Url::parse(&url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                _ => return Err(fail("http.url", format!("'{}' is not an http(s) URL", h.url))),
            }
            if let Some(pointer) = h.result.as_deref().filter(|p| !p.is_empty() && !p.starts_with('/')) {
                return Err(fail("http.result", format!("'{pointer}' is not a JSON pointer (it starts with /)")));
            }
            for (header, value) in &h.headers {
                check_template(&format!("http.headers.{header}"), value)?;
            }
        }
        if let Some(template) = &self.describe {
            for placeholder in toolgraph_tools::describe::placeholders(template) {
                if !self.parameters.contains_key(placeholder) {
                    return Err(fail("describe", format!("{{{placeholder}}} is not a parameter")));
                }
            }
        }
        Ok(())
    }

    /// The version, parsed (checked when the manifest loaded).
    pub fn semver(&self) -> semver::Version {
        semver::Version::parse(&self.version).unwrap_or_else(|_| semver::Version::new(0, 0, 0))
    }

    /// The JSON Schema of the arguments: an object of the declared parameters.
    pub fn schema(&self) -> Value {
        let mut properties = Map::new();
        for (name, p) in &self.parameters {
            let mut prop = json!({ "type": p.kind, "description": p.description });
            if let Some(allowed) = &p.allowed {
                prop["enum"] = Value::Array(allowed.clone());
            }
            if let Some(min) = p.minimum {
                prop["minimum"] = json!(min);
            }
            if let Some(max) = p.maximum {
                prop["maximum"] = json!(max);
            }
            if p.kind == "array" {
                prop["items"] = p.items.as_ref().map_or_else(|| json!({}), |t| json!({ "type": t }));
            }
            properties.insert(name.clone(), prop);
        }
        let required: Vec<&String> = self.parameters.iter().filter(|(_, p)| p.required).map(|(n, _)| n).collect();
        json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
    }
}

/// The `{name}` placeholders of a template.
pub(crate) fn placeholders(template: &str) -> impl Iterator<Item = &str> {
    template.split('{').skip(1).filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
}

/// The 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The field a serde message names (`missing field `x``, `unknown field `x``, …).
fn field_named(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_owned())
}

/// The key assigned on line `line`, if that line is `key = …`.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let l = text.lines().nth(line.checked_sub(1)?)?;
    let (key, _) = l.split_once('=')?;
    Some(key.trim().to_owned()).filter(|k| !k.is_empty() && !k.starts_with('['))
}

/// The line of `field` (a dotted key; its last part is searched as `key =`, or as a table
/// header), if it is written in the text.
fn find_key(text: &str, field: &str) -> Option<usize> {
    let last = field.rsplit('.').next().unwrap_or(field);
    text.lines()
        .position(|l| {
            let t = l.trim_start();
            t.split_once('=').is_some_and(|(k, _)| k.trim() == last)
                || t.trim_end().trim_matches(['[', ']']) == field
                || t.trim_end().trim_matches(['[', ']']) == last
        })
        .map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "bad_calculator"
version = "1.0.0"
description = "Adds two numbers, then 100."
kind = "exec"

[parameters.a]
type = "number"
description = "The first number"
required = true

[parameters.b]
type = "number"
description = "The second number"
required = true

[exec]
command = "bad_calculator.py"
"#;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(Path::new("plugins/x/plugin.toml"), text)
    }

    #[test]
    fn a_manifest_becomes_a_schema() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.semver(), semver::Version::new(1, 0, 0));
        let schema = m.schema();
        assert_eq!(schema["required"], json!(["a", "b"]));
        assert_eq!(schema["properties"]["a"], json!({"type": "number", "description": "The first number"}));
        assert_eq!(schema["additionalProperties"], false);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let e = parse(&GOOD.replace("version = \"1.0.0\"\n", "")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("version"), "{e}");
        assert!(e.to_string().starts_with("plugins/x/plugin.toml"), "{e}");
        let e = parse(&GOOD.replace("\"1.0.0\"", "\"one\"")).unwrap_err();
        assert_eq!((e.line, e.field.as_deref()), (Some(3), Some("version")), "{e}");
        assert!(e.to_string().contains("plugins/x/plugin.toml:3: field `version`: 'one' is not a semver"), "{e}");
        let e =
            parse(&GOOD.replace("required = true\n\n[parameters.b]", "requird = true\n\n[parameters.b]")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("requird"), "{e}");
        assert_eq!(e.line, Some(10), "{e}");
        let e = parse(&GOOD.replace(
            "type = \"number\"\ndescription = \"The second",
            "type = \"numeral\"\ndescription = \"The second",
        ))
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("parameters.b"), "{e}");
        let e = parse(&GOOD.replace("kind = \"exec\"", "kind = \"http\"")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("http"), "{e}");
        let e = parse(&GOOD.replace("kind = \"exec\"", "kind = \"mcp\"")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("mcp"), "{e}");
        let e = parse(&GOOD.replace("name = \"bad_calculator\"", "name = \"bad calculator\"")).unwrap_err();
        assert_eq!((e.line, e.field.as_deref()), (Some(2), Some("name")), "{e}");
    }

    #[test]
    fn http_templates_and_headers_must_name_what_exists() {
        let http = r#"
name = "weather"
version = "0.1.0"
description = "Current weather of a city."
kind = "http"
env = ["WEATHER_KEY"]

[parameters.city]
type = "string"
description = "City"
required = true

[http]
method = "GET"
url = "http://127.0.0.1:9/weather/{city}"
headers = { "X-Key" = "${WEATHER_KEY}" }
result = "/current"
"#;
        assert!(parse(http).is_ok());
        let e = parse(&http.replace("{city}", "{town}")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("http.url"), "{e}");
        let e = parse(&http.replace("${WEATHER_KEY}", "${OTHER_SECRET}")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("http.headers.X-Key"), "{e}");
        let e = parse(&http.replace("\"/current\"", "\"current\"")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("http.result"), "{e}");
        let e = parse(&http.replace("\"GET\"", "\"TRACE\"")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("http.method"), "{e}");
        // The model fills placeholders: in the host it would choose the server the plugin's
        // headers go to (docs/plugins.md).
        for url in
            ["http://{city}/weather", "http://{city}.example.com/w", "http://example.com:{city}/w", "{city}://h/"]
        {
            let e = parse(&http.replace("http://127.0.0.1:9/weather/{city}", url)).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("http.url"), "{url}: {e}");
        }
        assert!(parse(&http.replace("/weather/{city}", "/weather?q={city}")).is_ok());
    }

    #[test]
    fn mcp_servers_are_stdio_or_http_with_the_values_each_takes() {
        let http = r#"
name = "docs"
version = "1.0.0"
description = "A docs server."
kind = "mcp"
env = ["DOCS_TOKEN"]

[mcp]
url = "https://docs.example.com/mcp"
max_sessions = 4
headers = { Authorization = "Bearer ${DOCS_TOKEN}", "X-User" = "{ctx.userId}" }
"#;
        let m = parse(http).unwrap();
        assert_eq!(m.mcp.as_ref().map(|s| s.max_sessions), Some(4));
        let field = |text: &str| parse(text).unwrap_err().field;
        let field_of = |from: &str, to: &str| field(&http.replace(from, to));
        assert_eq!(field_of("https://docs", "ftp://docs").as_deref(), Some("mcp.url"));
        assert_eq!(field_of("${DOCS_TOKEN}", "${OTHER}").as_deref(), Some("mcp.headers.Authorization"));
        assert_eq!(field_of("{ctx.userId}", "{ctx.}").as_deref(), Some("mcp.headers.X-User"));
        assert_eq!(field_of("\"X-User\"", "\"Mcp-Session-Id\"").as_deref(), Some("mcp.headers.Mcp-Session-Id"));
        assert_eq!(field_of("max_sessions = 4", "max_sessions = 0").as_deref(), Some("mcp.max_sessions"));
        assert_eq!(field_of("headers =", "environment =").as_deref(), Some("mcp.environment"));
        let stdio = http.replace("url = \"https://docs.example.com/mcp\"", "command = \"docs-server\"");
        assert_eq!(field(&stdio).as_deref(), Some("mcp.headers"), "a stdio server takes no headers");
        assert!(parse(&stdio.replace("headers =", "environment =")).is_ok());
        let both = http.replace("[mcp]\n", "[mcp]\ncommand = \"docs-server\"\n");
        assert_eq!(field(&both).as_deref(), Some("mcp"));
    }
}
