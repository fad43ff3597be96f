//! The conversation store: conversations, their messages and pending actions.
//!
//! Invariants live in the database so replicas can share it: conversation and message ids
//! are allocated by the database, one running turn per conversation is a conditional
//! update, and one decision per pending action is an update guarded by `decision IS NULL`.

use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::SqlitePool;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A store failure (the database is down or answered an error).
#[derive(Debug, thiserror::Error)]
#[error("conversation store: {0}")]
pub struct StoreError(pub String);

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
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
    pool: SqlitePool,
}

impl SqliteConversationStore {
    /// Migrates `pool` (shared with the checkpointer) and wraps it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn new(pool: SqlitePool) -> Result<Self, StoreError> {
        let mut m = sqlx::migrate!("./migrations/sqlite");
        // The checkpoint migrations share the migrations table.
        m.set_ignore_missing(true);
        m.run(&pool).await.map_err(|e| StoreError(format!("migration failed: {e}")))?;
        Ok(Self { pool })
    }
}

/// Inserts a message through any connection (a pool, or a caller's transaction).
pub(crate) async fn sqlite_insert_message(
    conn: &mut sqlx::SqliteConnection,
    conversation: i64,
    role: &str,
    content: &str,
) -> Result<i64, sqlx::Error> {
    Ok(sqlx::query("INSERT INTO messages (conversation_id, role, content, created_at_ms) VALUES (?1, ?2, ?3, ?4)")
        .bind(conversation)
        .bind(role)
        .bind(content)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?
        .last_insert_rowid())
}

/// Inserts a pending action and its message through `conn` (inside the caller's transaction).
pub(crate) async fn sqlite_insert_pending(
    conn: &mut sqlx::SqliteConnection,
    conversation: i64,
    run_id: &str,
    interrupt_id: &str,
    tool_name: &str,
    description: &str,
    arguments: &Value,
) -> Result<i64, sqlx::Error> {
    let id = sqlite_insert_message(conn, conversation, "pending", description).await?;
    sqlx::query(
        "INSERT INTO pending_actions (message_id, conversation_id, run_id, interrupt_id, tool_name, description, arguments)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .bind(id)
    .bind(conversation)
    .bind(run_id)
    .bind(interrupt_id)
    .bind(tool_name)
    .bind(description)
    .bind(arguments.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(id)
}

fn pending_from_row(r: &sqlx::sqlite::SqliteRow) -> PendingAction {
    PendingAction {
        message_id: r.get("message_id"),
        conversation_id: r.get("conversation_id"),
        run_id: r.get("run_id"),
        interrupt_id: r.get("interrupt_id"),
        tool_name: r.get("tool_name"),
        description: r.get("description"),
        arguments: serde_json::from_str(r.get::<&str, _>("arguments")).unwrap_or(Value::Null),
        decision: r.get::<Option<i64>, _>("decision").map(|d| d != 0),
        response: r.get("response"),
    }
}

#[async_trait]
impl ConversationStore for SqliteConversationStore {
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError> {
        let id =
            sqlx::query("INSERT INTO conversations (tenant_id, user_id, agent, created_at_ms) VALUES (?1, ?2, ?3, ?4)")
                .bind(tenant)
                .bind(user)
                .bind(agent)
                .bind(now_ms())
                .execute(&self.pool)
                .await?
                .last_insert_rowid();
        Ok(id)
    }

    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError> {
        let row = sqlx::query("SELECT id, agent FROM conversations WHERE id = ?1 AND tenant_id = ?2 AND user_id = ?3")
            .bind(id)
            .bind(tenant)
            .bind(user)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Conversation { id: r.get(0), agent: r.get(1) }))
    }

    async fn begin_turn(&self, conversation: i64, run_id: &str, stale_after_ms: i64) -> Result<bool, StoreError> {
        let now = now_ms();
        let n = sqlx::query(
            "UPDATE conversations SET running_run = ?1, running_since_ms = ?2
             WHERE id = ?3 AND (running_run IS NULL OR running_since_ms < ?4)",
        )
        .bind(run_id)
        .bind(now)
        .bind(conversation)
        .bind(now - stale_after_ms)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE conversations SET running_run = NULL, running_since_ms = NULL WHERE id = ?1 AND running_run = ?2",
        )
        .bind(conversation)
        .bind(run_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn add_message(&self, conversation: i64, role: &str, content: &str) -> Result<i64, StoreError> {
        let mut conn = self.pool.acquire().await?;
        Ok(sqlite_insert_message(&mut conn, conversation, role, content).await?)
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
        let mut tx = self.pool.begin().await?;
        let id = sqlite_insert_pending(&mut tx, conversation, run_id, interrupt_id, tool_name, description, arguments)
            .await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn last_message(&self, conversation: i64, role: &str) -> Result<Option<(i64, String)>, StoreError> {
        let row = sqlx::query(
            "SELECT id, content FROM messages WHERE conversation_id = ?1 AND role = ?2 ORDER BY id DESC LIMIT 1",
        )
        .bind(conversation)
        .bind(role)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    async fn pending(
        &self,
        tenant: i64,
        user: i64,
        conversation: i64,
        message_id: i64,
    ) -> Result<Option<PendingAction>, StoreError> {
        let row = sqlx::query(
            "SELECT p.* FROM pending_actions p JOIN conversations c ON c.id = p.conversation_id
             WHERE p.message_id = ?1 AND p.conversation_id = ?2 AND c.tenant_id = ?3 AND c.user_id = ?4",
        )
        .bind(message_id)
        .bind(conversation)
        .bind(tenant)
        .bind(user)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(pending_from_row))
    }

    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError> {
        let rows =
            sqlx::query("SELECT * FROM pending_actions WHERE conversation_id = ?1 AND run_id = ?2 ORDER BY message_id")
                .bind(conversation)
                .bind(run_id)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.iter().map(pending_from_row).collect())
    }

    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError> {
        let n = sqlx::query("UPDATE pending_actions SET decision = ?1 WHERE message_id = ?2 AND decision IS NULL")
            .bind(i64::from(approve))
            .bind(message_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if n == 1 {
            return Ok(Decided::Recorded);
        }
        let prev: Option<i64> = sqlx::query_scalar("SELECT decision FROM pending_actions WHERE message_id = ?1")
            .bind(message_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(if prev.map(|d| d != 0) == Some(approve) { Decided::Same } else { Decided::Conflict })
    }

    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE pending_actions SET response = ?1 WHERE conversation_id = ?2 AND run_id = ?3")
            .bind(response)
            .bind(conversation)
            .bind(run_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn messages(&self, conversation: i64) -> Result<Vec<(i64, String, String)>, StoreError> {
        let rows = sqlx::query("SELECT id, role, content FROM messages WHERE conversation_id = ?1 ORDER BY id")
            .bind(conversation)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    }

    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        for table in ["pending_actions", "messages"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE conversation_id IN (SELECT id FROM conversations WHERE id = ?1 AND tenant_id = ?2 AND user_id = ?3)"
            ))
            .bind(id)
            .bind(tenant)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        }
        let n = sqlx::query("DELETE FROM conversations WHERE id = ?1 AND tenant_id = ?2 AND user_id = ?3")
            .bind(id)
            .bind(tenant)
            .bind(user)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n == 1)
    }

    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM conversations WHERE tenant_id = ?1 AND user_id = ?2")
            .bind(tenant)
            .bind(user)
            .fetch_all(&mut *tx)
            .await?;
        for table in ["pending_actions", "messages"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE conversation_id IN (SELECT id FROM conversations WHERE tenant_id = ?1 AND user_id = ?2)"
            ))
            .bind(tenant)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM conversations WHERE tenant_id = ?1 AND user_id = ?2")
            .bind(tenant)
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(ids)
    }

    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM conversations WHERE tenant_id = ?1")
            .bind(tenant)
            .fetch_all(&mut *tx)
            .await?;
        for table in ["pending_actions", "messages"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE conversation_id IN (SELECT id FROM conversations WHERE tenant_id = ?1)"
            ))
            .bind(tenant)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM conversations WHERE tenant_id = ?1").bind(tenant).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(ids)
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
