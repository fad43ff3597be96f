//! The conversation store: conversations, their messages and pending actions.
//!
//! Invariants live in the database so replicas can share it: conversation and message ids
//! are allocated by the database, one running turn per conversation is a conditional
//! update, and one decision per pending action is an update guarded by `decision IS NULL`.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use toolgraph_graph::{SqliteDatabase, SqliteError};

/// A store failure (the database is down or answered an error).
#[derive(Debug, thiserror::Error)]
#[error("conversation store: {0}")]
pub struct StoreError(pub String);

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self(e.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self(e.to_string())
    }
}

impl From<SqliteError> for StoreError {
    fn from(e: SqliteError) -> Self {
        Self(e.to_string())
    }
}

/// A conversation's owner-visible facts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Conversation {
    /// Id.
    pub id: i64,
    /// The agent it talks to.
    pub agent: String,
}

/// A write action awaiting a decision.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingAction {
    /// The message id the contract exposes.
    pub message_id: i64,
    /// Its conversation.
    pub conversation_id: i64,
    /// The run that paused for it (its group: decided together).
    pub run_id: String,
    /// The graph's interrupt id.
    pub interrupt_id: String,
    /// The tool.
    pub tool_name: String,
    /// Human-readable action text.
    pub description: String,
    /// The tool arguments.
    pub arguments: Value,
    /// `Some(true)` approved, `Some(false)` rejected, `None` undecided.
    pub decision: Option<bool>,
    /// The final confirm response of its group, once the group was resumed.
    pub response: Option<String>,
}

/// What recording a decision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decided {
    /// Newly recorded.
    Recorded,
    /// The same decision was already recorded.
    Same,
    /// The opposite decision was already recorded.
    Conflict,
}

/// Storage of conversations, messages and pending actions.
#[async_trait]
pub trait ConversationStore: Send + Sync + 'static {
    /// Creates a conversation and returns its id.
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError>;
    /// The conversation if it exists and belongs to `tenant` and `user`.
    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError>;
    /// Claims the conversation for `run_id`; `false` when another fresh run holds it.
    async fn begin_turn(&self, conversation: i64, run_id: &str, stale_after_ms: i64) -> Result<bool, StoreError>;
    /// Releases the conversation if `run_id` holds it.
    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError>;
    /// Appends a message; returns its id.
    async fn add_message(&self, conversation: i64, role: &str, content: &str) -> Result<i64, StoreError>;
    /// Persists a pending action (and its message); returns the message id.
    #[allow(clippy::too_many_arguments)]
    async fn add_pending(
        &self,
        conversation: i64,
        run_id: &str,
        interrupt_id: &str,
        tool_name: &str,
        description: &str,
        arguments: &Value,
    ) -> Result<i64, StoreError>;
    /// The newest message of `role` in the conversation: `(id, content)`.
    async fn last_message(&self, conversation: i64, role: &str) -> Result<Option<(i64, String)>, StoreError>;
    /// The pending action `message_id` if it belongs to that conversation, tenant and user.
    async fn pending(
        &self,
        tenant: i64,
        user: i64,
        conversation: i64,
        message_id: i64,
    ) -> Result<Option<PendingAction>, StoreError>;
    /// Every pending action of one run, in message order.
    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError>;
    /// Records a decision once.
    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError>;
    /// Stores the final confirm response of a run's group, for idempotent replays.
    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError>;
    /// Messages of a conversation as `(id, role, content)`, oldest first.
    async fn messages(&self, conversation: i64) -> Result<Vec<(i64, String, String)>, StoreError>;
    /// Deletes a conversation of `tenant`/`user`; whether it existed.
    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError>;
    /// Deletes a user's conversations; their ids.
    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError>;
    /// Deletes a tenant's conversations; their ids.
    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError>;
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The SQLite store, in the same database file as the checkpoints.
#[derive(Debug, Clone)]
pub struct SqliteConversationStore {
    db: SqliteDatabase,
}

impl SqliteConversationStore {
    /// Migrates `db` (shared with the checkpointer) and wraps it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn new(db: SqliteDatabase) -> Result<Self, StoreError> {
        // The checkpoint migrations share the migrations table.
        db.migrate(sqlx::migrate!("./migrations/sqlite")).await?;
        Ok(Self { db })
    }

    /// Runs `f` on the database's connection; one hand-off to its thread per operation.
    async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut rusqlite::Connection) -> rusqlite::Result<R> + Send + 'static,
    ) -> Result<R, StoreError> {
        Ok(self.db.call(f).await??)
    }
}

/// Inserts a message through `conn` (the connection, or a caller's transaction).
pub(crate) fn sqlite_insert_message(
    conn: &rusqlite::Connection,
    conversation: i64,
    role: &str,
    content: &str,
) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO messages (conversation_id, role, content, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![conversation, role, content, now_ms()])?;
    Ok(conn.last_insert_rowid())
}

/// Inserts a pending action and its message through `conn` (inside the caller's transaction).
/// `arguments` is the encoded JSON: encoding is the caller's, not the shared database thread's.
pub(crate) fn sqlite_insert_pending(
    conn: &rusqlite::Connection,
    conversation: i64,
    run_id: &str,
    interrupt_id: &str,
    tool_name: &str,
    description: &str,
    arguments: &str,
) -> rusqlite::Result<i64> {
    let id = sqlite_insert_message(conn, conversation, "pending", description)?;
    conn.prepare_cached(
        "INSERT INTO pending_actions (message_id, conversation_id, run_id, interrupt_id, tool_name, description, arguments)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![id, conversation, run_id, interrupt_id, tool_name, description, arguments])?;
    Ok(id)
}

const PENDING_COLUMNS: &str = "p.message_id, p.conversation_id, p.run_id, p.interrupt_id, p.tool_name, p.description, p.arguments, p.decision, p.response";

fn pending_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PendingAction> {
    Ok(PendingAction {
        message_id: r.get(0)?,
        conversation_id: r.get(1)?,
        run_id: r.get(2)?,
        interrupt_id: r.get(3)?,
        tool_name: r.get(4)?,
        description: r.get(5)?,
        arguments: serde_json::from_str(&r.get::<_, String>(6)?).unwrap_or(Value::Null),
        decision: r.get::<_, Option<i64>>(7)?.map(|d| d != 0),
        response: r.get(8)?,
    })
}

/// Deletes the conversations `selected` (a `WHERE` over `conversations` with its parameters)
/// and, through the schema's `ON DELETE CASCADE` (foreign keys are on, see
/// `SqliteDatabase`), their messages and pending actions, in one statement; returns their ids.
fn sqlite_delete_conversations(
    conn: &mut rusqlite::Connection,
    selected: &str,
    params: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<Vec<i64>> {
    conn.prepare(&format!("DELETE FROM conversations WHERE {selected} RETURNING id"))?
        .query_map(params, |r| r.get(0))?
        .collect()
}

#[async_trait]
impl ConversationStore for SqliteConversationStore {
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError> {
        let agent = agent.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO conversations (tenant_id, user_id, agent, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![tenant, user, agent, now_ms()])?;
            Ok(c.last_insert_rowid())
        })
        .await
    }

    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError> {
        self.call(move |c| {
            c.prepare_cached("SELECT id, agent FROM conversations WHERE id = ?1 AND tenant_id = ?2 AND user_id = ?3")?
                .query_row(params![id, tenant, user], |r| Ok(Conversation { id: r.get(0)?, agent: r.get(1)? }))
                .optional()
        })
        .await
    }

    async fn begin_turn(&self, conversation: i64, run_id: &str, stale_after_ms: i64) -> Result<bool, StoreError> {
        let run_id = run_id.to_owned();
        let now = now_ms();
        let n = self
            .call(move |c| {
                c.prepare_cached(
                    "UPDATE conversations SET running_run = ?1, running_since_ms = ?2
                     WHERE id = ?3 AND (running_run IS NULL OR running_since_ms < ?4)",
                )?
                .execute(params![run_id, now, conversation, now - stale_after_ms])
            })
            .await?;
        Ok(n == 1)
    }

    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError> {
        let run_id = run_id.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "UPDATE conversations SET running_run = NULL, running_since_ms = NULL
                 WHERE id = ?1 AND running_run = ?2",
            )?
            .execute(params![conversation, run_id])
        })
        .await?;
        Ok(())
    }

    async fn add_message(&self, conversation: i64, role: &str, content: &str) -> Result<i64, StoreError> {
        let (role, content) = (role.to_owned(), content.to_owned());
        self.call(move |c| sqlite_insert_message(c, conversation, &role, &content)).await
    }

    async fn add_pending(
        &self,
        conversation: i64,
        run_id: &str,
        interrupt_id: &str,
        tool_name: &str,
        description: &str,
        arguments: &Value,
    ) -> Result<i64, StoreError> {
        let owned = [run_id, interrupt_id, tool_name, description].map(str::to_owned);
        let arguments = arguments.to_string();
        self.call(move |c| {
            let [run_id, interrupt_id, tool_name, description] = &owned;
            let tx = c.transaction()?;
            let id =
                sqlite_insert_pending(&tx, conversation, run_id, interrupt_id, tool_name, description, &arguments)?;
            tx.commit()?;
            Ok(id)
        })
        .await
    }

    async fn last_message(&self, conversation: i64, role: &str) -> Result<Option<(i64, String)>, StoreError> {
        let role = role.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "SELECT id, content FROM messages WHERE conversation_id = ?1 AND role = ?2 ORDER BY id DESC LIMIT 1",
            )?
            .query_row(params![conversation, role], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
        })
        .await
    }

    async fn pending(
        &self,
        tenant: i64,
        user: i64,
        conversation: i64,
        message_id: i64,
    ) -> Result<Option<PendingAction>, StoreError> {
        self.call(move |c| {
            c.prepare_cached(&format!(
                "SELECT {PENDING_COLUMNS} FROM pending_actions p JOIN conversations c ON c.id = p.conversation_id
                 WHERE p.message_id = ?1 AND p.conversation_id = ?2 AND c.tenant_id = ?3 AND c.user_id = ?4"
            ))?
            .query_row(params![message_id, conversation, tenant, user], pending_from_row)
            .optional()
        })
        .await
    }

    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError> {
        let run_id = run_id.to_owned();
        self.call(move |c| {
            c.prepare_cached(&format!(
                "SELECT {PENDING_COLUMNS} FROM pending_actions p
                 WHERE p.conversation_id = ?1 AND p.run_id = ?2 ORDER BY p.message_id"
            ))?
            .query_map(params![conversation, run_id], pending_from_row)?
            .collect()
        })
        .await
    }

    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError> {
        self.call(move |c| {
            let n = c
                .prepare_cached("UPDATE pending_actions SET decision = ?1 WHERE message_id = ?2 AND decision IS NULL")?
                .execute(params![i64::from(approve), message_id])?;
            if n == 1 {
                return Ok(Decided::Recorded);
            }
            let prev: Option<i64> =
                c.query_row("SELECT decision FROM pending_actions WHERE message_id = ?1", [message_id], |r| r.get(0))?;
            Ok(if prev.map(|d| d != 0) == Some(approve) { Decided::Same } else { Decided::Conflict })
        })
        .await
    }

    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError> {
        let (run_id, response) = (run_id.to_owned(), response.to_owned());
        self.call(move |c| {
            c.execute(
                "UPDATE pending_actions SET response = ?1 WHERE conversation_id = ?2 AND run_id = ?3",
                params![response, conversation, run_id],
            )
        })
        .await?;
        Ok(())
    }

    async fn messages(&self, conversation: i64) -> Result<Vec<(i64, String, String)>, StoreError> {
        self.call(move |c| {
            c.prepare_cached("SELECT id, role, content FROM messages WHERE conversation_id = ?1 ORDER BY id")?
                .query_map([conversation], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .await
    }

    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError> {
        let ids = self
            .call(move |c| {
                sqlite_delete_conversations(c, "id = ?1 AND tenant_id = ?2 AND user_id = ?3", &[&id, &tenant, &user])
            })
            .await?;
        Ok(ids.len() == 1)
    }

    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError> {
        self.call(move |c| sqlite_delete_conversations(c, "tenant_id = ?1 AND user_id = ?2", &[&tenant, &user])).await
    }

    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError> {
        self.call(move |c| sqlite_delete_conversations(c, "tenant_id = ?1", &[&tenant])).await
    }
}

/// An in-memory store (tests and benchmarks; the peer uses LangGraph's in-memory saver).
#[derive(Debug, Default)]
pub struct MemoryConversationStore {
    inner: Mutex<MemoryInner>,
}

/// A stored conversation: tenant, user, facts, and the run holding it since (ms).
type MemoryConversation = (i64, i64, Conversation, Option<(String, i64)>);

#[derive(Debug, Default)]
struct MemoryInner {
    next_id: i64,
    conversations: HashMap<i64, MemoryConversation>,
    messages: Vec<(i64, i64, String, String)>,
    pending: Vec<PendingAction>,
}

impl MemoryConversationStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    fn lock(&self) -> MutexGuard<'_, MemoryInner> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MemoryInner {
    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }
    fn owned(&self, tenant: i64, user: i64, id: i64) -> bool {
        self.conversations.get(&id).is_some_and(|(t, u, _, _)| *t == tenant && *u == user)
    }
    /// Removes the conversations matching `gone(id, tenant, user)` with everything in them.
    fn remove_conversations(&mut self, gone: impl Fn(i64, i64, i64) -> bool) -> Vec<i64> {
        let gone: Vec<i64> =
            self.conversations.iter().filter(|(id, (t, u, _, _))| gone(**id, *t, *u)).map(|(id, _)| *id).collect();
        for id in &gone {
            self.conversations.remove(id);
        }
        self.messages.retain(|m| !gone.contains(&m.1));
        self.pending.retain(|p| !gone.contains(&p.conversation_id));
        gone
    }
}

#[async_trait]
impl ConversationStore for MemoryConversationStore {
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError> {
        let mut g = self.lock();
        let id = g.id();
        g.conversations.insert(id, (tenant, user, Conversation { id, agent: agent.to_owned() }, None));
        Ok(id)
    }

    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError> {
        let g = self.lock();
        Ok(g.conversations.get(&id).filter(|(t, u, _, _)| *t == tenant && *u == user).map(|(_, _, c, _)| c.clone()))
    }

    async fn begin_turn(&self, conversation: i64, run_id: &str, stale_after_ms: i64) -> Result<bool, StoreError> {
        let mut g = self.lock();
        let now = now_ms();
        let Some(c) = g.conversations.get_mut(&conversation) else { return Ok(false) };
        match &c.3 {
            Some((_, since)) if *since >= now - stale_after_ms => Ok(false),
            _ => {
                c.3 = Some((run_id.to_owned(), now));
                Ok(true)
            }
        }
    }

    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError> {
        let mut g = self.lock();
        if let Some(c) = g.conversations.get_mut(&conversation)
            && c.3.as_ref().is_some_and(|(r, _)| r == run_id)
        {
            c.3 = None;
        }
        Ok(())
    }

    async fn add_message(&self, conversation: i64, role: &str, content: &str) -> Result<i64, StoreError> {
        let mut g = self.lock();
        let id = g.id();
        g.messages.push((id, conversation, role.to_owned(), content.to_owned()));
        Ok(id)
    }

    async fn add_pending(
        &self,
        conversation: i64,
        run_id: &str,
        interrupt_id: &str,
        tool_name: &str,
        description: &str,
        arguments: &Value,
    ) -> Result<i64, StoreError> {
        let mut g = self.lock();
        let id = g.id();
        g.messages.push((id, conversation, "pending".into(), description.to_owned()));
        g.pending.push(PendingAction {
            message_id: id,
            conversation_id: conversation,
            run_id: run_id.to_owned(),
            interrupt_id: interrupt_id.to_owned(),
            tool_name: tool_name.to_owned(),
            description: description.to_owned(),
            arguments: arguments.clone(),
            decision: None,
            response: None,
        });
        Ok(id)
    }

    async fn pending(
        &self,
        tenant: i64,
        user: i64,
        conversation: i64,
        message_id: i64,
    ) -> Result<Option<PendingAction>, StoreError> {
        let g = self.lock();
        if !g.owned(tenant, user, conversation) {
            return Ok(None);
        }
        Ok(g.pending.iter().find(|p| p.message_id == message_id && p.conversation_id == conversation).cloned())
    }

    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError> {
        let g = self.lock();
        Ok(g.pending.iter().filter(|p| p.conversation_id == conversation && p.run_id == run_id).cloned().collect())
    }

    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError> {
        let mut g = self.lock();
        let Some(p) = g.pending.iter_mut().find(|p| p.message_id == message_id) else {
            return Err(StoreError(format!("no pending action {message_id}")));
        };
        Ok(match p.decision {
            None => {
                p.decision = Some(approve);
                Decided::Recorded
            }
            Some(d) if d == approve => Decided::Same,
            Some(_) => Decided::Conflict,
        })
    }

    async fn last_message(&self, conversation: i64, role: &str) -> Result<Option<(i64, String)>, StoreError> {
        let g = self.lock();
        Ok(g.messages.iter().rev().find(|m| m.1 == conversation && m.2 == role).map(|m| (m.0, m.3.clone())))
    }

    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError> {
        let mut g = self.lock();
        for p in g.pending.iter_mut().filter(|p| p.conversation_id == conversation && p.run_id == run_id) {
            p.response = Some(response.to_owned());
        }
        Ok(())
    }

    async fn messages(&self, conversation: i64) -> Result<Vec<(i64, String, String)>, StoreError> {
        let g = self.lock();
        Ok(g.messages.iter().filter(|m| m.1 == conversation).map(|m| (m.0, m.2.clone(), m.3.clone())).collect())
    }

    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError> {
        Ok(self.lock().remove_conversations(|c, t, u| c == id && t == tenant && u == user).len() == 1)
    }

    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError> {
        Ok(self.lock().remove_conversations(|_, t, u| t == tenant && u == user))
    }

    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError> {
        Ok(self.lock().remove_conversations(|_, t, _| t == tenant))
    }
}
