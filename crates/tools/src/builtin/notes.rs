//! A note book in the data directory: `note_write` (a write tool: a human approves each
//! note before it is saved) and `note_list` (read). Notes are Markdown files under
//! `<data_dir>/notes/`, written atomically so a crash never leaves half a note.

use crate::{Tool, ToolBuilder, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// Longest note body accepted, in characters.
const MAX_BODY_CHARS: u32 = 20_000;

/// Arguments of `note_write`.
#[derive(Debug, Deserialize, JsonSchema)]
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

/// Arguments of `note_list`.
#[derive(Debug, Deserialize, JsonSchema)]
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
    .handler(move |_ctx, a: NoteWriteArgs| {
        let dir = dir.clone();
        async move { write_note(&dir, &a).await }
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
    .handler(move |_ctx, a: NoteListArgs| {
        let dir = dir.clone();
        async move { list_notes(&dir, a.contains.as_deref()).await }
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
    use crate::{ToolClass, ToolContext, ToolErrorKind};

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
        let ctx = ToolContext::default();
        let w = reg.get("note_write").unwrap();
        assert_eq!(w.spec().class, ToolClass::Write);
        let args = json!({"title": "Docker exam", "body": "Study volumes and networks."});
        assert_eq!(w.describe(&args), "Save the note \"Docker exam\" (27 characters) as notes/docker-exam.md");
        let out = reg.call(&ctx, "note_write", &args).await;
        assert_eq!(out.to_json()["path"], "notes/docker-exam.md");
        let saved = std::fs::read_to_string(dir.path().join("notes/docker-exam.md")).unwrap();
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
        let out = reg.call(&ToolContext::default(), "note_write", &json!({"title": "???", "body": "x"})).await;
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
