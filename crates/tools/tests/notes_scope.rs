//! The note book is per tenant and per user (docs/tools.md): one person's
//! notes are never listed, matched by `contains`, or replaced by another tenant or another user
//! of the same tenant, a call without the turn's identity is refused, and the identity comes
//! from the service's context only — never from the model's arguments, never as a raw path.

use serde_json::{Value, json};
use std::path::Path;
use toolgraph_tools::{ToolContext, ToolErrorKind, ToolRegistry};

/// The context the chat service gives a turn (`turn_identity` in the server crate).
fn who(tenant: &str, user: i64) -> ToolContext {
    ToolContext::default().set("tenant", json!(tenant)).set("tenantId", json!(1)).set("userId", json!(user))
}

fn registry(dir: &Path) -> ToolRegistry {
    toolgraph_tools::builtin::registry(dir).unwrap()
}

async fn titles(reg: &ToolRegistry, ctx: &ToolContext, contains: Option<&str>) -> Vec<String> {
    let args = contains.map_or_else(|| json!({}), |c| json!({ "contains": c }));
    let out = reg.call(ctx, "note_list", &args).await;
    assert!(out.is_success(), "{out:?}");
    out.to_json()["notes"].as_array().unwrap().iter().map(|n| n["title"].as_str().unwrap().to_owned()).collect()
}

/// Every note file under `dir`, read back.
fn all_files(dir: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                out.push((p, text));
            }
        }
    }
    out
}

#[tokio::test]
async fn another_tenant_neither_lists_nor_matches_nor_overwrites_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let (acme, rival) = (who("acme", 7), who("rival", 7));
    let secret = json!({"title": "Plan", "body": "The acquisition price is 42 million."});
    assert!(reg.call(&acme, "note_write", &secret).await.is_success());

    assert_eq!(titles(&reg, &rival, None).await, Vec::<String>::new(), "listed for another tenant");
    assert_eq!(titles(&reg, &rival, Some("42 million")).await, Vec::<String>::new(), "matched by contains");
    // The same title and user id in another tenant is another note: writing it neither fails as
    // "already exists" nor replaces acme's.
    let theirs = json!({"title": "Plan", "body": "Nothing here.", "overwrite": true});
    assert!(reg.call(&rival, "note_write", &theirs).await.is_success());
    assert_eq!(titles(&reg, &acme, Some("42 million")).await, ["Plan"], "acme's note was replaced");
    assert_eq!(titles(&reg, &rival, Some("42 million")).await, Vec::<String>::new());
}

#[tokio::test]
async fn another_user_of_the_same_tenant_neither_lists_nor_overwrites_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let (ana, bob) = (who("acme", 1), who("acme", 2));
    let diary = json!({"title": "Diary", "body": "Ana's private thoughts."});
    assert!(reg.call(&ana, "note_write", &diary).await.is_success());
    assert_eq!(titles(&reg, &bob, None).await, Vec::<String>::new());
    assert_eq!(titles(&reg, &bob, Some("private")).await, Vec::<String>::new());
    let clobber = json!({"title": "Diary", "body": "Bob was here.", "overwrite": true});
    assert!(reg.call(&bob, "note_write", &clobber).await.is_success());
    assert_eq!(titles(&reg, &ana, Some("private thoughts")).await, ["Diary"]);
    assert_eq!(titles(&reg, &bob, Some("bob was here")).await, ["Diary"]);
}

#[tokio::test]
async fn a_call_without_the_turns_tenant_or_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let note = json!({"title": "Orphan", "body": "Whose is this?"});
    let no_user = ToolContext::default().set("tenant", json!("acme"));
    let no_tenant = ToolContext::default().set("userId", json!(7));
    let blank = ToolContext::default().set("tenant", json!("")).set("userId", json!(""));
    let odd = ToolContext::default().set("tenant", json!("acme")).set("userId", json!({"id": 7}));
    for ctx in [ToolContext::default(), no_user, no_tenant, blank, odd] {
        for (tool, args) in [("note_write", note.clone()), ("note_list", json!({}))] {
            let out = reg.call(&ctx, tool, &args).await;
            let err = out.error().unwrap_or_else(|| panic!("{tool} ran without an identity: {ctx:?}"));
            assert_eq!(err.kind, ToolErrorKind::Denied, "{err:?}");
            assert!(err.message.contains("tenant") && err.message.contains("user"), "{}", err.message);
        }
    }
    assert!(all_files(dir.path()).is_empty(), "nothing written: {:?}", all_files(dir.path()));
}

#[tokio::test]
async fn the_model_cannot_name_the_tenant_or_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    for tool in ["note_write", "note_list"] {
        let spec = reg.get(tool).unwrap().spec().clone();
        let props = spec.parameters["properties"].as_object().unwrap();
        for key in ["tenant", "tenantId", "userId", "user"] {
            assert!(!props.contains_key(key), "{tool} lets the model pass {key}");
        }
        assert_eq!(spec.parameters["additionalProperties"], Value::Bool(false), "{tool}: unknown arguments pass");
    }
    assert!(reg.call(&who("acme", 1), "note_write", &json!({"title": "Mine", "body": "Ana's."})).await.is_success());
    // A model that tries anyway is told its arguments are wrong, and reads nothing of acme's.
    let sneaky = reg.call(&who("rival", 9), "note_list", &json!({"tenant": "acme", "userId": 1})).await;
    assert_eq!(sneaky.error().map(|e| e.kind), Some(ToolErrorKind::InvalidArguments), "{sneaky:?}");
}

#[tokio::test]
async fn hostile_or_look_alike_identities_stay_apart_and_inside_the_notes_directory() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let ids: Vec<(Value, Value)> = vec![
        (json!("../../outside"), json!("..")),
        (json!("acme/../rival"), json!(".")),
        (json!("acme"), json!("1")),
        (json!("acme"), json!(1)),
        (json!("Acme"), json!(1)),
        (json!("acme/x"), json!("y")),
        (json!("acme"), json!("x/y")),
        (json!("acme-x"), json!("y")),
        (json!("ACME"), json!("%2e%2e")),
        (json!("C:\\evil"), json!("\u{0}")),
    ];
    for (i, (tenant, user)) in ids.iter().enumerate() {
        let ctx = ToolContext::default().set("tenant", tenant.clone()).set("userId", user.clone());
        let out = reg
            .call(&ctx, "note_write", &json!({"title": "Same", "body": format!("owner {i}"), "overwrite": true}))
            .await;
        assert!(out.is_success(), "{tenant} {user}: {out:?}");
    }
    let files = all_files(dir.path());
    let notes = dir.path().join("notes");
    for (path, _) in &files {
        assert!(path.starts_with(&notes), "{} escaped the notes directory", path.display());
        assert!(!path.components().any(|c| c.as_os_str() == ".."), "{}", path.display());
    }
    // The numeric user 1 and the string "1" of one tenant are the same person (the service's user
    // id, replacing the note); every other pair is apart, each with a note of its own.
    assert_eq!(files.len(), ids.len() - 1, "{files:?}");
    for (i, (tenant, user)) in ids.iter().enumerate().skip(3) {
        let ctx = ToolContext::default().set("tenant", tenant.clone()).set("userId", user.clone());
        let listed = reg.call(&ctx, "note_list", &json!({})).await.to_json();
        assert_eq!(listed["notes"].as_array().map(Vec::len), Some(1), "{tenant} {user}: {listed}");
        assert!(listed["notes"][0]["excerpt"].as_str().unwrap().contains(&format!("owner {i}")), "{listed}");
    }
}
