//! A note book in the data directory: `note_write` (a write tool: a human approves each
//! note before it is saved) and `note_list` (read). Each person has a note book of their own:
//! Markdown files under `<data_dir>/notes/<tenant>/<user>/`, the tenant and the user taken from
//! the call's context (set by the service, never by the model), written atomically so a crash
//! never leaves half a note (docs/tools.md).

use crate::{Tool, ToolBuilder, ToolContext, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// Longest note body accepted, in characters.
const MAX_BODY_CHARS: u32 = 20_000;

/// Arguments of `note_write`. Whose note book it goes to is not among them: that is the call's
/// context, and an unknown argument (a `tenant` or `userId` a model made up) is refused.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteWriteArgs {
    /// Title of the note; it also names the file.
    #[schemars(length(min = 1, max = 120))]
    pub title: String,
    /// Markdown body of the note.
    #[schemars(length(min = 1, max = 20000))]
    pub body: String,
    /// Replace an existing note with the same title.
    #[serde(default)]
    pub overwrite: bool,
}

/// Arguments of `note_list` (whose notes: the call's context, as for `note_write`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteListArgs {
    /// Only notes whose title or body contains this text (case-insensitive).
    #[schemars(length(max = 200))]
    pub contains: Option<String>,
}

/// File name (without `.md`) for a title: lowercase letters and digits of any script,
/// everything else collapsed into single dashes.
fn slug(title: &str) -> String {
    let mut out = String::new();
    for c in title.chars().flat_map(char::to_lowercase) {
        if c.is_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let trimmed = out.trim_end_matches('-');
    trimmed.chars().take(80).collect()
}

fn notes_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("notes")
}

/// Longest tenant or user identity accepted, in bytes: its directory name (`_` and two hex
/// digits a byte) stays well under the 255 bytes file systems allow.
const MAX_IDENTITY_BYTES: usize = 120;

/// The note book of the call's tenant and user: `<root>/<tenant>/<user>`, each a
/// [`directory_name`]. The identity is the context's `tenant` (the slug, which the chat service
/// and the MCP export both set) and `userId` (a number from the chat service, a string from an
/// MCP caller the service vouched for). A call without both is refused: before notes were
/// scoped, everyone's notes were one folder, and a call that cannot say whose notes it wants
/// must not fall back to a shared one.
fn book_of(root: &Path, ctx: &ToolContext) -> Result<PathBuf, ToolError> {
    let tenant = ctx.get("tenant").and_then(identity);
    let user = ctx.get("userId").and_then(identity);
    let (Some(tenant), Some(user)) = (tenant, user) else {
        return Err(ToolError::denied(
            "notes belong to one tenant and one user, and this call does not say which (the service sets the \
             tenant and the user of a turn; an MCP client without a user has no notes)",
        ));
    };
    Ok(root.join(directory_name(&tenant)?).join(directory_name(&user)?))
}

/// The text of an identity value: a non-empty string, or an integer (a user id `7` and `"7"`
/// are the same user). Anything else is no identity.
fn identity(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// A directory name for an identity that can neither leave the notes directory nor meet
/// another identity's: a plain lowercase name (`a-z`, `0-9`, then `-` and `_` too) stays as it
/// is, so an operator recognises tenants and users on disk; anything else (`..`, `/`, capitals,
/// which case-insensitive file systems would fold together) becomes `_` and the hex of its
/// UTF-8 bytes. A plain name never starts with `_`, so the two forms never collide.
fn directory_name(identity: &str) -> Result<String, ToolError> {
    let plain = identity.len() <= 64
        && identity.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && identity.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if plain {
        return Ok(identity.to_owned());
    }
    if identity.len() > MAX_IDENTITY_BYTES {
        return Err(ToolError::denied(format!(
            "the tenant or user of this call is longer than {MAX_IDENTITY_BYTES} bytes: no note book for it"
        )));
    }
    Ok(format!("_{}", hex::encode(identity)))
}

/// The `note_write` write tool.
pub fn note_write(data_dir: &Path) -> Arc<dyn Tool> {
    let dir = notes_dir(data_dir);
    ToolBuilder::<NoteWriteArgs>::new(
        "note_write",
        "Save a Markdown note for the user. Needs the user's approval before it is written.",
    )
    .write(|a| {
        let verb = if a.overwrite { "Replace" } else { "Save" };
        format!(
            "{verb} the note \"{}\" ({} characters) as notes/{}.md",
            a.title,
            a.body.chars().count(),
            slug(&a.title)
        )
    })
    .display_name("Write note")
    .display_description("Saves a note in the data directory")
    .param_display("title", "Title")
    .param_display("body", "Text")
    .param_display("overwrite", "Replace an existing note")
    .handler(move |ctx, a: NoteWriteArgs| {
        let book = book_of(&dir, &ctx);
        async move { write_note(&book?, &a).await }
    })
    .expect("note_write's schema is static and valid") // invariant: covered by tests
}

async fn write_note(dir: &Path, a: &NoteWriteArgs) -> Result<serde_json::Value, ToolError> {
    let name = slug(&a.title);
    if name.is_empty() {
        return Err(ToolError::invalid_arguments("the title needs at least one letter or digit"));
    }
    if a.body.chars().count() > MAX_BODY_CHARS as usize {
        return Err(ToolError::invalid_arguments(format!("the body is longer than {MAX_BODY_CHARS} characters")));
    }
    let io = |e: std::io::Error| ToolError::unavailable(format!("cannot write to {}: {e}", dir.display()));
    tokio::fs::create_dir_all(dir).await.map_err(io)?;
    let path = dir.join(format!("{name}.md"));
    let content = format!("# {}\n\n{}\n", a.title.trim(), a.body.trim_end());
    if a.overwrite {
        // Write beside, then rename: readers see the old note or the new one, never half.
        let tmp = dir.join(format!(".{name}.md.tmp-{}", std::process::id()));
        let mut f = tokio::fs::File::create(&tmp).await.map_err(io)?;
        f.write_all(content.as_bytes()).await.map_err(io)?;
        f.sync_all().await.map_err(io)?;
        tokio::fs::rename(&tmp, &path).await.map_err(io)?;
    } else {
        let mut f = match tokio::fs::OpenOptions::new().write(true).create_new(true).open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(ToolError::denied(format!(
                    "a note named notes/{name}.md already exists; pass overwrite=true to replace it"
                )));
            }
            Err(e) => return Err(io(e)),
        };
        f.write_all(content.as_bytes()).await.map_err(io)?;
        f.sync_all().await.map_err(io)?;
    }
    Ok(json!({ "ok": true, "path": format!("notes/{name}.md"), "characters": a.body.chars().count() }))
}

/// The `note_list` read tool.
pub fn note_list(data_dir: &Path) -> Arc<dyn Tool> {
    let dir = notes_dir(data_dir);
    ToolBuilder::<NoteListArgs>::new(
        "note_list",
        "List the notes the user saved earlier with note_write (not documents), optionally only those containing a text.",
    )
    .display_name("List notes")
    .param_display("contains", "Containing")
    .handler(move |ctx, a: NoteListArgs| {
        let book = book_of(&dir, &ctx);
        async move { list_notes(&book?, a.contains.as_deref()).await }
    })
    .expect("note_list's schema is static and valid") // invariant: covered by tests
}

async fn list_notes(dir: &Path, contains: Option<&str>) -> Result<serde_json::Value, ToolError> {
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(json!({ "ok": true, "notes": [] }));
        }
        Err(e) => {
            return Err(ToolError::unavailable(format!("cannot read {}: {e}", dir.display())));
        }
    };
    let needle = contains.map(str::to_lowercase);
    let mut notes = Vec::new();
    while let Ok(Some(entry)) = entries.next_entry().await {
        let path = entry.path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        if !file.ends_with(".md") || file.starts_with('.') {
            continue;
        }
        let Ok(text) = tokio::fs::read_to_string(&path).await else {
            continue;
        };
        if let Some(n) = &needle
            && !text.to_lowercase().contains(n)
        {
            continue;
        }
        let title = text.lines().next().unwrap_or_default().trim_start_matches("# ").to_owned();
        let excerpt: String = text.lines().skip(2).collect::<Vec<_>>().join(" ").chars().take(160).collect();
        notes.push(json!({ "title": title, "path": format!("notes/{file}"), "excerpt": excerpt }));
    }
    notes.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    Ok(json!({ "ok": true, "notes": notes }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ToolClass, ToolErrorKind};

    /// A turn of user 7 of tenant `acme`, as the chat service sets it.
    fn acme() -> ToolContext {
        ToolContext::default().set("tenant", json!("acme")).set("userId", json!(7))
    }

    #[test]
    fn identities_name_directories_that_neither_escape_nor_collide() {
        assert_eq!(directory_name("acme").unwrap(), "acme");
        assert_eq!(directory_name("42").unwrap(), "42");
        assert_eq!(directory_name("..").unwrap(), "_2e2e");
        assert_eq!(directory_name("Acme").unwrap(), "_41636d65", "capitals would fold on some file systems");
        assert_eq!(directory_name("_2e2e").unwrap(), "_5f32653265", "a hex-looking name is hexed itself");
        assert_eq!(directory_name(&"a".repeat(65)).unwrap(), format!("_{}", "61".repeat(65)));
        assert!(directory_name(&"a".repeat(121)).is_err());
        assert_eq!(identity(&json!(7)), identity(&json!("7")));
        assert_eq!(identity(&json!("")), None);
        assert_eq!(identity(&json!(7.5)), None);
    }

    #[test]
    fn slugs_keep_letters_of_any_script() {
        assert_eq!(slug("Lista de la compra: pan & leche"), "lista-de-la-compra-pan-leche");
        assert_eq!(slug("Ghi chú Điều 5"), "ghi-chú-điều-5");
        assert_eq!(slug("!!!"), "");
    }

    #[tokio::test]
    async fn write_then_list_then_refuse_to_clobber() {
        let dir = tempfile::tempdir().unwrap();
        let reg = crate::builtin::registry(dir.path()).unwrap();
        let ctx = acme();
        let w = reg.get("note_write").unwrap();
        assert_eq!(w.spec().class, ToolClass::Write);
        let args = json!({"title": "Docker exam", "body": "Study volumes and networks."});
        assert_eq!(w.describe(&args), "Save the note \"Docker exam\" (27 characters) as notes/docker-exam.md");
        let out = reg.call(&ctx, "note_write", &args).await;
        assert_eq!(out.to_json()["path"], "notes/docker-exam.md");
        let saved = std::fs::read_to_string(dir.path().join("notes/acme/7/docker-exam.md")).unwrap();
        assert_eq!(saved, "# Docker exam\n\nStudy volumes and networks.\n");

        let again = reg.call(&ctx, "note_write", &args).await;
        assert_eq!(again.error().unwrap().kind, ToolErrorKind::Denied);
        let replaced =
            reg.call(&ctx, "note_write", &json!({"title": "Docker exam", "body": "New text", "overwrite": true})).await;
        assert!(replaced.is_success(), "{replaced:?}");

        let listed = reg.call(&ctx, "note_list", &json!({"contains": "new TEXT"})).await.to_json();
        assert_eq!(listed["notes"][0]["title"], "Docker exam");
        let none = reg.call(&ctx, "note_list", &json!({"contains": "kubernetes"})).await.to_json();
        assert_eq!(none["notes"], json!([]));
    }

    #[tokio::test]
    async fn a_title_without_letters_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let reg = crate::builtin::registry(dir.path()).unwrap();
        let out = reg.call(&acme(), "note_write", &json!({"title": "???", "body": "x"})).await;
        assert_eq!(out.error().unwrap().kind, ToolErrorKind::InvalidArguments);
    }
}

/// Path traversal through a note's title (docs/reliability.md): whatever the model writes, the
/// file lands directly inside the notes directory.
#[cfg(test)]
mod slug_props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_title_names_a_file_inside_the_notes_directory(
            title in prop_oneof![".{0,200}", "(\\.\\./|\\.\\.\\\\|/|~|%2e%2e%2f|\u{0}|[a-z]{1,4}){1,12}"],
        ) {
            let name = slug(&title);
            prop_assert!(!name.contains(['/', '\\', '.', '\0', '~', '%']), "{:?} -> {:?}", title, name);
            prop_assert!(name.chars().count() <= 80);
            let dir = Path::new("/data/notes");
            let path = dir.join(format!("{name}.md"));
            prop_assert_eq!(path.parent(), Some(dir));
        }
    }
}
