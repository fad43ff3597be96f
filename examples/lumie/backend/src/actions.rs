//! The write tools the assistant may run once an administrator approved them
//! (`POST /internal/chatbot/tools/{toolName}`): publish an announcement, message the parents or
//! students of a class or of one student by SMS or Telegram, schedule a task.
//!
//! Each action runs at most once per `(conversationId, callId)`: its result is stored in the
//! same transaction as its effect, and a repeated call answers that result without acting.
//! Messages are queued in `messages_sent` (the outbox a real gateway would drain).

use crate::academy::{TenantData, stored_result};
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::{Sqlite, Transaction};

/// The tools this backend runs.
pub const TOOLS: &[&str] = &["create_announcement", "send_sms", "send_telegram", "schedule_task"];

/// Longest SMS (one segment).
const SMS_CHARS: usize = 160;
/// Longest Telegram message.
const TELEGRAM_CHARS: usize = 4096;

/// Why an action did not run.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// No tool of that name.
    #[error("unknown tool '{0}'; this backend runs: create_announcement, send_sms, send_telegram, schedule_task")]
    UnknownTool(String),
    /// The arguments cannot be acted on; the text says why and what would work.
    #[error("{0}")]
    Invalid(String),
    /// The database failed.
    #[error("the academy database failed: {0}")]
    Database(#[from] sqlx::Error),
}

/// One approved call.
pub struct ActionCall<'a> {
    /// The tool.
    pub tool: &'a str,
    /// The model's id of the call; with `conversation_id`, the action's identity.
    pub call_id: &'a str,
    /// The conversation it was approved in.
    pub conversation_id: i64,
    /// Who approved it.
    pub user_id: i64,
    /// The tool's arguments.
    pub arguments: &'a Value,
}

/// Runs `call` on `tenant`'s data, or answers its first result when it already ran.
///
/// # Errors
/// An unknown tool, arguments that cannot be acted on, or a failing database; nothing is
/// changed then.
pub async fn run(tenant: &TenantData, call: &ActionCall<'_>) -> Result<Value, ActionError> {
    if !TOOLS.contains(&call.tool) {
        return Err(ActionError::UnknownTool(call.tool.to_owned()));
    }
    let mut tx = tenant.pool.begin().await?;
    let earlier: Option<String> =
        sqlx::query_scalar("SELECT result FROM chatbot_actions WHERE conversation_id = ? AND call_id = ?")
            .bind(call.conversation_id)
            .bind(call.call_id)
            .fetch_optional(&mut *tx)
            .await?;
    if let Some(result) = earlier {
        return Ok(stored_result(&result));
    }
    let result = match call.tool {
        "create_announcement" => announce(&mut tx, call).await?,
        "send_sms" => message(&mut tx, Channel::Sms, call.arguments).await?,
        "send_telegram" => message(&mut tx, Channel::Telegram, call.arguments).await?,
        _ => schedule(&mut tx, call.arguments).await?,
    };
    sqlx::query("INSERT INTO chatbot_actions (conversation_id, call_id, tool, result) VALUES (?, ?, ?, ?)")
        .bind(call.conversation_id)
        .bind(call.call_id)
        .bind(call.tool)
        .bind(result.to_string())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(result)
}

fn arguments<T: for<'de> Deserialize<'de>>(tool: &str, value: &Value) -> Result<T, ActionError> {
    serde_json::from_value(value.clone()).map_err(|e| ActionError::Invalid(format!("{tool}: {e}")))
}

fn check_length(field: &str, text: &str, max: usize) -> Result<(), ActionError> {
    let n = text.trim().chars().count();
    if n == 0 {
        return Err(ActionError::Invalid(format!("{field} is empty")));
    }
    if n > max {
        return Err(ActionError::Invalid(format!("{field} has {n} characters; at most {max} fit")));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Announcement {
    title: String,
    content: String,
}

async fn announce(tx: &mut Transaction<'_, Sqlite>, call: &ActionCall<'_>) -> Result<Value, ActionError> {
    let a: Announcement = arguments(call.tool, call.arguments)?;
    check_length("title", &a.title, 200)?;
    check_length("content", &a.content, 4000)?;
    let (id, at): (i64, String) = sqlx::query_as(
        "INSERT INTO announcements (title, content, published_at, published_by) \
         VALUES (?, ?, datetime('now'), ?) RETURNING id, published_at",
    )
    .bind(a.title.trim())
    .bind(a.content.trim())
    .bind(call.user_id)
    .fetch_one(&mut **tx)
    .await?;
    Ok(json!({ "announcementId": id, "title": a.title.trim(), "publishedAt": at }))
}

#[derive(Clone, Copy, PartialEq)]
enum Channel {
    Sms,
    Telegram,
}

#[derive(Deserialize, Default, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Audience {
    #[default]
    Parents,
    Students,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    /// A class name ("5A") or one student's full name.
    to: String,
    #[serde(default)]
    audience: Audience,
    message: String,
}

/// Queues `args.message` to the parents (or students) of a class or of one student: one row
/// per person with an address on this channel; people without one are reported, not guessed.
async fn message(tx: &mut Transaction<'_, Sqlite>, channel: Channel, args: &Value) -> Result<Value, ActionError> {
    let (tool, name, limit) = match channel {
        Channel::Sms => ("send_sms", "sms", SMS_CHARS),
        Channel::Telegram => ("send_telegram", "telegram", TELEGRAM_CHARS),
    };
    let m: Message = arguments(tool, args)?;
    check_length("message", &m.message, limit)?;
    let to = m.to.trim();
    let class = to.strip_prefix("class ").or_else(|| to.strip_prefix("Class ")).unwrap_or(to).trim();
    // (student, parent, parent's phone, parent's Telegram, student's phone)
    type Person = (String, String, String, Option<String>, Option<String>);
    let select = "SELECT s.name, s.parent_name, s.parent_phone, s.parent_telegram, s.phone FROM students s";
    let mut people: Vec<Person> =
        sqlx::query_as(&format!("{select} JOIN classes c ON c.id = s.class_id WHERE c.name = ? ORDER BY s.id"))
            .bind(class)
            .fetch_all(&mut **tx)
            .await?;
    if people.is_empty() {
        people = sqlx::query_as(&format!("{select} WHERE s.name = ?")).bind(to).fetch_all(&mut **tx).await?;
    }
    if people.is_empty() {
        let classes: Vec<String> =
            sqlx::query_scalar("SELECT name FROM classes ORDER BY name").fetch_all(&mut **tx).await?;
        return Err(ActionError::Invalid(format!(
            "no class or student is named '{to}'; the classes are {}",
            classes.join(", ")
        )));
    }
    let (mut sent, mut missing) = (Vec::new(), Vec::new());
    for (student, parent, parent_phone, parent_telegram, phone) in people {
        let (recipient, address) = match (m.audience, channel) {
            (Audience::Parents, Channel::Sms) => (parent, Some(parent_phone)),
            (Audience::Parents, Channel::Telegram) => (parent, parent_telegram),
            (Audience::Students, Channel::Sms) => (student, phone),
            (Audience::Students, Channel::Telegram) => (student, None),
        };
        let Some(address) = address else {
            missing.push(recipient);
            continue;
        };
        sqlx::query(
            "INSERT INTO messages_sent (channel, recipient_name, address, body, queued_at) \
             VALUES (?, ?, ?, ?, datetime('now'))",
        )
        .bind(name)
        .bind(&recipient)
        .bind(&address)
        .bind(m.message.trim())
        .execute(&mut **tx)
        .await?;
        sent.push(recipient);
    }
    if sent.is_empty() {
        return Err(ActionError::Invalid(format!(
            "nobody of '{to}' has an address for {name} on file ({}); nothing was sent",
            missing.join(", ")
        )));
    }
    Ok(json!({ "channel": name, "queued": sent.len(), "recipients": sent, "withoutAddress": missing }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Task {
    title: String,
    due_at: String,
    #[serde(default)]
    assignee: Option<String>,
}

async fn schedule(tx: &mut Transaction<'_, Sqlite>, args: &Value) -> Result<Value, ActionError> {
    let t: Task = arguments("schedule_task", args)?;
    check_length("title", &t.title, 200)?;
    // SQLite reads ISO 8601 ("2026-11-30T09:00", "2026-11-30 09:00:00Z"); anything else is NULL.
    let due: Option<String> =
        sqlx::query_scalar("SELECT datetime(?)").bind(t.due_at.trim()).fetch_one(&mut **tx).await?;
    let Some(due) = due else {
        return Err(ActionError::Invalid(format!(
            "due_at '{}' is not a date and time such as 2026-11-30T09:00:00Z",
            t.due_at
        )));
    };
    let assignee = t.assignee.as_deref().map(str::trim).filter(|a| !a.is_empty());
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO tasks (title, due_at, assignee, created_at) VALUES (?, ?, ?, datetime('now')) RETURNING id",
    )
    .bind(t.title.trim())
    .bind(&due)
    .bind(assignee)
    .fetch_one(&mut **tx)
    .await?;
    Ok(json!({ "taskId": id, "title": t.title.trim(), "dueAt": due, "assignee": assignee }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::academy::Academy;

    fn call<'a>(tool: &'a str, call_id: &'a str, arguments: &'a Value) -> ActionCall<'a> {
        ActionCall { tool, call_id, conversation_id: 1, user_id: 1, arguments }
    }

    async fn count(t: &TenantData, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&t.pool).await.unwrap()
    }

    #[tokio::test]
    async fn an_sms_to_a_class_reaches_each_parent_once_even_when_called_twice() {
        let dir = tempfile::tempdir().unwrap();
        let academy = Academy::open(dir.path()).await.unwrap();
        let t = academy.tenant(1, "demo").unwrap();
        let args = json!({"to": "5A", "audience": "parents", "message": "No class tomorrow"});
        let first = run(t, &call("send_sms", "c1", &args)).await.unwrap();
        assert_eq!(first["queued"], 4, "{first}");
        assert_eq!(first["recipients"][0], "Kim Soyeon");
        let again = run(t, &call("send_sms", "c1", &args)).await.unwrap();
        assert_eq!(again, first, "a repeated call answers the first result");
        assert_eq!(count(t, "SELECT COUNT(*) FROM messages_sent").await, 4, "and sends nothing again");
        let phones: Vec<String> =
            sqlx::query_scalar("SELECT address FROM messages_sent ORDER BY id").fetch_all(&t.pool).await.unwrap();
        assert_eq!(phones[1], "+821030000002");
        // Another call id is another action.
        run(t, &call("send_sms", "c2", &args)).await.unwrap();
        assert_eq!(count(t, "SELECT COUNT(*) FROM messages_sent").await, 8);
    }

    #[tokio::test]
    async fn telegram_reports_who_has_no_address_and_refuses_when_nobody_has_one() {
        let dir = tempfile::tempdir().unwrap();
        let academy = Academy::open(dir.path()).await.unwrap();
        let t = academy.tenant(1, "demo").unwrap();
        let args = json!({"to": "class 5a", "message": "Photos of the trip are up"});
        let out = run(t, &call("send_telegram", "t1", &args)).await.unwrap();
        assert_eq!(out["queued"], 3, "{out}");
        assert_eq!(out["withoutAddress"], json!(["Lee Junho"]));
        let one = json!({"to": "Jang Yejun", "message": "Hello"});
        let err = run(t, &call("send_telegram", "t2", &one)).await.unwrap_err().to_string();
        assert!(err.contains("Jang Minseok") && err.contains("nothing was sent"), "{err}");
        let students = json!({"to": "6A", "audience": "students", "message": "Quiz on Friday"});
        let out = run(t, &call("send_sms", "t3", &students)).await.unwrap();
        assert_eq!((out["queued"].as_i64(), out["withoutAddress"].clone()), (Some(3), json!(["Oh Junseo"])));
        assert_eq!(count(t, "SELECT COUNT(*) FROM chatbot_actions").await, 2, "the refused call left nothing");
    }

    #[tokio::test]
    async fn bad_arguments_are_refused_with_a_reason_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let academy = Academy::open(dir.path()).await.unwrap();
        let t = academy.tenant(1, "demo").unwrap();
        let cases = [
            ("send_sms", json!({"to": "7C", "message": "Hi"}), "classes are 5A, 5B, 6A"),
            ("send_sms", json!({"to": "5A", "message": "x".repeat(161)}), "161 characters; at most 160"),
            ("send_sms", json!({"to": "5A"}), "missing field `message`"),
            ("send_sms", json!({"to": "5A", "message": "Hi", "audience": "teachers"}), "unknown variant"),
            ("create_announcement", json!({"title": " ", "content": "x"}), "title is empty"),
            ("schedule_task", json!({"title": "Call", "due_at": "next friday"}), "not a date and time"),
            ("delete_students", json!({}), "unknown tool 'delete_students'"),
        ];
        for (i, (tool, args, reason)) in cases.iter().enumerate() {
            let id = format!("b{i}");
            let err = run(t, &call(tool, &id, args)).await.unwrap_err().to_string();
            assert!(err.contains(reason), "{tool} {args}: {err}");
        }
        let changed = count(t, "SELECT (SELECT COUNT(*) FROM messages_sent) + (SELECT COUNT(*) FROM tasks) + (SELECT COUNT(*) FROM chatbot_actions)").await;
        assert_eq!(changed, 0);
        assert_eq!(count(t, "SELECT COUNT(*) FROM announcements").await, 2);
    }

    #[tokio::test]
    async fn announcements_and_tasks_are_stored_with_who_and_when() {
        let dir = tempfile::tempdir().unwrap();
        let academy = Academy::open(dir.path()).await.unwrap();
        let t = academy.tenant(2, "north").unwrap();
        let a = json!({"title": "Exam dates", "content": "Algebra exam on December 12."});
        let out = run(t, &call("create_announcement", "a1", &a)).await.unwrap();
        let by: i64 = sqlx::query_scalar("SELECT published_by FROM announcements WHERE id = ?")
            .bind(out["announcementId"].as_i64().unwrap())
            .fetch_one(&t.pool)
            .await
            .unwrap();
        assert_eq!(by, 1);
        let task = json!({"title": "Order lab goggles", "due_at": "2026-12-01T09:30:00Z", "assignee": "Pablo"});
        let out = run(t, &call("schedule_task", "k1", &task)).await.unwrap();
        assert_eq!((out["dueAt"].as_str(), out["assignee"].as_str()), (Some("2026-12-01 09:30:00"), Some("Pablo")));
    }
}
