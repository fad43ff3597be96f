//! [`SqliteConversationStore`]: the embedded default, in the same database file (and on the
//! same connection thread) as the checkpoints, so a step's messages commit with its record.

use crate::items::{ITEMS_READ, IndexFields, ItemVector, MemoryItem, decode_namespace, encode_namespace, prefix_match};
use crate::retention::IdleRule;
use crate::usage::{TurnUsage, from_db, to_db};
use crate::{
    Conversation, ConversationStore, ConversationSummary, Decided, LEGACY_CLAIM_MS, NewPending, PendingAction,
    PendingLookup, ReleasedTurn, Role, StoreError, StoredMessage, THREADS_READ, Thread, TurnClaim, Upload, now_ms,
    summary_title,
};
use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
use serde_json::Value;
use toolgraph_graph::SqliteDatabase;

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
        let migrator =
            crate::SQLITE_MIGRATIONS.migrator().await.map_err(|e| StoreError(format!("migration failed: {e}")))?;
        db.migrate(migrator).await?;
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
pub(crate) fn insert_message(
    conn: &rusqlite::Connection,
    conversation: i64,
    role: Role,
    content: &str,
) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO messages (conversation_id, role, content, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![conversation, role.as_str(), content, now_ms()])?;
    Ok(conn.last_insert_rowid())
}

/// Inserts a pending action and its message through `conn` (inside the caller's transaction).
/// `arguments` is `pending.arguments` encoded: encoding is the caller's work, not the shared
/// database thread's.
pub(crate) fn insert_pending(
    conn: &rusqlite::Connection,
    pending: &NewPending,
    arguments: &str,
) -> rusqlite::Result<i64> {
    let p = pending;
    let id = insert_message(conn, p.conversation_id, Role::Pending, &p.description)?;
    conn.prepare_cached(
        "INSERT INTO pending_actions (message_id, conversation_id, run_id, interrupt_id, tool_name, description, arguments)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![id, p.conversation_id, p.run_id, p.interrupt_id, p.tool_name, p.description, arguments])?;
    Ok(id)
}

const PENDING_COLUMNS: &str = "p.message_id, p.conversation_id, p.run_id, p.interrupt_id, p.tool_name, p.description, p.arguments, p.decision, p.response";

fn pending_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PendingAction> {
    Ok(PendingAction {
        message_id: r.get(0)?,
        action: NewPending {
            conversation_id: r.get(1)?,
            run_id: r.get(2)?,
            interrupt_id: r.get(3)?,
            tool_name: r.get(4)?,
            description: r.get(5)?,
            arguments: serde_json::from_str(&r.get::<_, String>(6)?).unwrap_or(Value::Null),
        },
        decision: r.get::<_, Option<i64>>(7)?.map(|d| d != 0),
        response: r.get(8)?,
    })
}

/// A stored role name as a [`Role`]; the schema only ever holds the four names.
fn role_from(name: String, column: usize) -> rusqlite::Result<Role> {
    Role::parse(&name).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            column,
            rusqlite::types::Type::Text,
            format!("unknown message role '{name}'").into(),
        )
    })
}

/// Deletes the conversations `selected` (a `WHERE` over `conversations` with its parameters)
/// and, through the schema's `ON DELETE CASCADE` (foreign keys are on, see
/// `SqliteDatabase`), their messages and pending actions, in one statement; returns their ids.
fn delete_conversations(
    conn: &rusqlite::Connection,
    selected: &str,
    params: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<Vec<i64>> {
    conn.prepare(&format!("DELETE FROM conversations WHERE {selected} RETURNING id"))?
        .query_map(params, |r| r.get(0))?
        .collect()
}

/// A freed or taken-over claim from `tenant_id, id, agent, user_id, running_run`.
fn released_turn(r: &rusqlite::Row<'_>) -> rusqlite::Result<ReleasedTurn> {
    Ok(ReleasedTurn {
        tenant_id: r.get(0)?,
        conversation_id: r.get(1)?,
        agent: r.get(2)?,
        user_id: r.get(3)?,
        run_id: r.get::<_, Option<String>>(4)?.unwrap_or_default(),
    })
}

#[async_trait]
impl ConversationStore for SqliteConversationStore {
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError> {
        let agent = agent.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO conversations (tenant_id, user_id, agent, created_at_ms, last_active_ms)
                 VALUES (?1, ?2, ?3, ?4, ?4)",
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

    async fn list_conversations(
        &self,
        tenant: i64,
        user: i64,
        limit: usize,
    ) -> Result<Vec<ConversationSummary>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |c| {
            let mut st = c.prepare_cached(
                "SELECT c.id, c.agent, (SELECT m.content FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user'
                                        ORDER BY m.id LIMIT 1)
                 FROM conversations c WHERE c.tenant_id = ?1 AND c.user_id = ?2 ORDER BY c.id DESC LIMIT ?3",
            )?;
            let rows = st.query_map(params![tenant, user, limit], |r| {
                let first: Option<String> = r.get(2)?;
                Ok(ConversationSummary { id: r.get(0)?, agent: r.get(1)?, title: summary_title(&first.unwrap_or_default()) })
            })?;
            rows.collect()
        })
        .await
    }

    async fn begin_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let claim = claim.clone();
        let now = now_ms();
        let n = self
            .call(move |c| {
                c.prepare_cached(
                    "UPDATE conversations SET running_run = ?1, running_owner = ?2, running_since_ms = ?3,
                            running_until_ms = ?3 + ?4, last_active_ms = ?3
                     WHERE id = ?5 AND (running_run IS NULL OR COALESCE(running_until_ms, running_since_ms + ?6) < ?3)",
                )?
                .execute(params![
                    claim.run_id,
                    claim.owner,
                    now,
                    claim.lease_ms,
                    conversation,
                    LEGACY_CLAIM_MS
                ])
            })
            .await?;
        Ok(n == 1)
    }

    async fn renew_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let (run_id, until) = (claim.run_id.clone(), now_ms() + claim.lease_ms);
        let n = self
            .call(move |c| {
                c.prepare_cached("UPDATE conversations SET running_until_ms = ?1 WHERE id = ?2 AND running_run = ?3")?
                    .execute(params![until, conversation, run_id])
            })
            .await?;
        Ok(n == 1)
    }

    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError> {
        let run_id = run_id.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "UPDATE conversations SET running_run = NULL, running_owner = NULL, running_since_ms = NULL,
                        running_until_ms = NULL, last_active_ms = ?3
                 WHERE id = ?1 AND running_run = ?2",
            )?
            .execute(params![conversation, run_id, now_ms()])
        })
        .await?;
        Ok(())
    }

    async fn release_owner(&self, owner: &str) -> Result<Vec<ReleasedTurn>, StoreError> {
        let owner = owner.to_owned();
        self.call(move |c| {
            let tx = c.transaction()?;
            let released: Vec<ReleasedTurn> = tx
                .prepare(
                    "SELECT tenant_id, id, agent, user_id, running_run FROM conversations
                     WHERE running_owner = ?1 ORDER BY id",
                )?
                .query_map([&owner], released_turn)?
                .collect::<Result<_, _>>()?;
            tx.execute(
                "UPDATE conversations SET running_run = NULL, running_owner = NULL, running_since_ms = NULL,
                        running_until_ms = NULL
                 WHERE running_owner = ?1",
                [&owner],
            )?;
            tx.commit()?;
            Ok(released)
        })
        .await
    }

    async fn take_over_expired(&self, claim: &TurnClaim, limit: usize) -> Result<Vec<ReleasedTurn>, StoreError> {
        let claim = claim.clone();
        let now = now_ms();
        self.call(move |c| {
            // One transaction: SQLite has one writer, so nobody takes the same rows meanwhile.
            let tx = c.transaction()?;
            let expired: Vec<ReleasedTurn> = tx
                .prepare(
                    "SELECT tenant_id, id, agent, user_id, running_run FROM conversations
                     WHERE running_run IS NOT NULL AND COALESCE(running_until_ms, running_since_ms + ?1) < ?2
                     ORDER BY id LIMIT ?3",
                )?
                .query_map(params![LEGACY_CLAIM_MS, now, i64::try_from(limit).unwrap_or(i64::MAX)], released_turn)?
                .collect::<Result<_, _>>()?;
            for t in &expired {
                tx.execute(
                    "UPDATE conversations SET running_run = ?1, running_owner = ?2, running_since_ms = ?3,
                            running_until_ms = ?3 + ?4
                     WHERE id = ?5",
                    params![claim.run_id, claim.owner, now, claim.lease_ms, t.conversation_id],
                )?;
            }
            tx.commit()?;
            Ok(expired)
        })
        .await
    }

    async fn add_message(&self, conversation: i64, role: Role, content: &str) -> Result<i64, StoreError> {
        let content = content.to_owned();
        self.call(move |c| insert_message(c, conversation, role, &content)).await
    }

    async fn add_pending(&self, pending: &NewPending) -> Result<i64, StoreError> {
        let arguments = pending.arguments.to_string();
        let pending = pending.clone();
        self.call(move |c| {
            let tx = c.transaction()?;
            let id = insert_pending(&tx, &pending, &arguments)?;
            tx.commit()?;
            Ok(id)
        })
        .await
    }

    async fn pending(&self, lookup: &PendingLookup) -> Result<Option<PendingAction>, StoreError> {
        let l = *lookup;
        self.call(move |c| {
            c.prepare_cached(&format!(
                "SELECT {PENDING_COLUMNS} FROM pending_actions p JOIN conversations c ON c.id = p.conversation_id
                 WHERE p.message_id = ?1 AND p.conversation_id = ?2 AND c.tenant_id = ?3 AND c.user_id = ?4"
            ))?
            .query_row(params![l.message_id, l.conversation_id, l.tenant_id, l.user_id], pending_from_row)
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

    async fn messages(&self, conversation: i64) -> Result<Vec<StoredMessage>, StoreError> {
        self.call(move |c| {
            c.prepare_cached("SELECT id, role, content FROM messages WHERE conversation_id = ?1 ORDER BY id")?
                .query_map([conversation], |r| {
                    Ok(StoredMessage { id: r.get(0)?, role: role_from(r.get(1)?, 1)?, content: r.get(2)? })
                })?
                .collect()
        })
        .await
    }

    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError> {
        let ids = self
            .call(move |c| {
                delete_conversations(c, "id = ?1 AND tenant_id = ?2 AND user_id = ?3", &[&id, &tenant, &user])
            })
            .await?;
        Ok(ids.len() == 1)
    }

    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM threads WHERE tenant_id = ?1 AND user_id = ?2", params![tenant, user])?;
            tx.execute("DELETE FROM memory_items WHERE tenant_id = ?1 AND user_id = ?2", params![tenant, user])?;
            tx.execute("DELETE FROM turn_usage WHERE tenant_id = ?1 AND user_id = ?2", params![tenant, user])?;
            tx.execute("DELETE FROM uploads WHERE tenant_id = ?1 AND user_id = ?2", params![tenant, user])?;
            let ids = delete_conversations(&tx, "tenant_id = ?1 AND user_id = ?2", &[&tenant, &user])?;
            tx.commit()?;
            Ok(ids)
        })
        .await
    }

    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM threads WHERE tenant_id = ?1", params![tenant])?;
            tx.execute("DELETE FROM memory_items WHERE tenant_id = ?1", params![tenant])?;
            tx.execute("DELETE FROM turn_usage WHERE tenant_id = ?1", params![tenant])?;
            tx.execute("DELETE FROM uploads WHERE tenant_id = ?1", params![tenant])?;
            let ids = delete_conversations(&tx, "tenant_id = ?1", &[&tenant])?;
            tx.commit()?;
            Ok(ids)
        })
        .await
    }

    fn keeps_threads(&self) -> bool {
        true
    }

    async fn create_thread(&self, thread: &Thread) -> Result<bool, StoreError> {
        let t = thread.clone();
        let metadata = Value::Object(t.metadata.clone()).to_string();
        self.call(move |c| {
            let n = c
                .prepare_cached(
                    "INSERT INTO threads (thread_id, tenant_id, user_id, conversation_id, metadata, created_at_ms, updated_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (tenant_id, user_id, thread_id) DO NOTHING",
                )?
                .execute(params![t.id, t.tenant, t.user, t.conversation, metadata, t.created_at_ms, t.updated_at_ms])?;
            Ok(n == 1)
        })
        .await
    }

    async fn thread(&self, tenant: i64, user: i64, id: &str) -> Result<Option<Thread>, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            c.prepare_cached(&format!(
                "SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = ?1 AND tenant_id = ?2 AND user_id = ?3"
            ))?
            .query_row(params![id, tenant, user], thread_row)
            .optional()
        })
        .await
    }

    async fn threads(&self, tenant: i64, user: i64) -> Result<Vec<Thread>, StoreError> {
        self.call(move |c| {
            c.prepare_cached(&format!(
                "SELECT {THREAD_COLUMNS} FROM threads WHERE tenant_id = ?1 AND user_id = ?2
                 ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?3"
            ))?
            .query_map(params![tenant, user, THREADS_READ as i64], thread_row)?
            .collect()
        })
        .await
    }

    async fn update_thread(
        &self,
        tenant: i64,
        user: i64,
        id: &str,
        metadata: Option<&serde_json::Map<String, Value>>,
        conversation: Option<i64>,
    ) -> Result<bool, StoreError> {
        let id = id.to_owned();
        let metadata = metadata.map(|m| Value::Object(m.clone()).to_string());
        self.call(move |c| {
            let n = c
                .prepare_cached(
                    "UPDATE threads SET metadata = COALESCE(?4, metadata),
                         conversation_id = COALESCE(conversation_id, ?5),
                         updated_at_ms = MAX(?6, updated_at_ms + 1)
                     WHERE thread_id = ?1 AND tenant_id = ?2 AND user_id = ?3",
                )?
                .execute(params![id, tenant, user, metadata, conversation, now_ms()])?;
            Ok(n == 1)
        })
        .await
    }

    async fn rebind_thread(&self, tenant: i64, user: i64, id: &str, from: i64, to: i64) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "UPDATE threads SET conversation_id = ?5, updated_at_ms = MAX(?6, updated_at_ms + 1)
                 WHERE thread_id = ?1 AND tenant_id = ?2 AND user_id = ?3 AND conversation_id = ?4
                   AND EXISTS (SELECT 1 FROM conversations WHERE id = ?5 AND tenant_id = ?2 AND user_id = ?3)",
                params![id, tenant, user, from, to, now_ms()],
            )?;
            if n == 1 {
                tx.execute(
                    "INSERT OR IGNORE INTO thread_branches (tenant_id, user_id, thread_id, conversation_id)
                     VALUES (?1, ?2, ?3, ?4)",
                    params![tenant, user, id, from],
                )?;
                tx.execute(
                    "DELETE FROM thread_branches
                     WHERE tenant_id = ?1 AND user_id = ?2 AND thread_id = ?3 AND conversation_id = ?4",
                    params![tenant, user, id, to],
                )?;
            }
            tx.commit()?;
            Ok(n == 1)
        })
        .await
    }

    async fn thread_branches(&self, tenant: i64, user: i64, id: &str) -> Result<Vec<i64>, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            let mut q = c.prepare_cached(
                "SELECT conversation_id FROM thread_branches
                 WHERE tenant_id = ?1 AND user_id = ?2 AND thread_id = ?3 ORDER BY conversation_id",
            )?;
            let ids = q.query_map(params![tenant, user, id], |r| r.get(0))?.collect::<Result<Vec<i64>, _>>()?;
            Ok(ids)
        })
        .await
    }

    async fn delete_thread(&self, tenant: i64, user: i64, id: &str) -> Result<Option<Thread>, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "DELETE FROM thread_branches WHERE thread_id = ?1 AND tenant_id = ?2 AND user_id = ?3",
            )?
            .execute(params![id, tenant, user])?;
            c.prepare_cached(&format!(
                "DELETE FROM threads WHERE thread_id = ?1 AND tenant_id = ?2 AND user_id = ?3 RETURNING {THREAD_COLUMNS}"
            ))?
            .query_row(params![id, tenant, user], thread_row)
            .optional()
        })
        .await
    }

    async fn put_item(&self, tenant: i64, user: i64, item: &MemoryItem) -> Result<(), StoreError> {
        let namespace = encode_namespace(&item.namespace);
        let value = Value::Object(item.value.clone()).to_string();
        let i = item.clone();
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO memory_items (tenant_id, user_id, namespace, key, value, created_at_ms, updated_at_ms, ttl_ms, expires_at_ms,
                                           vector, vector_model, index_fields)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (tenant_id, user_id, namespace, key) DO UPDATE SET
                   value = excluded.value, updated_at_ms = excluded.updated_at_ms, ttl_ms = excluded.ttl_ms,
                   expires_at_ms = excluded.expires_at_ms, vector = excluded.vector, vector_model = excluded.vector_model,
                   index_fields = excluded.index_fields,
                   created_at_ms = CASE WHEN memory_items.expires_at_ms IS NOT NULL
                                         AND memory_items.expires_at_ms <= excluded.updated_at_ms
                                        THEN excluded.created_at_ms ELSE memory_items.created_at_ms END",
            )?
            .execute(params![
                tenant,
                user,
                namespace,
                i.key,
                value,
                i.created_at_ms,
                i.updated_at_ms,
                i.ttl_ms,
                i.expires_at_ms,
                i.vector.as_ref().map(ItemVector::to_bytes),
                i.vector.as_ref().map(|v| v.model.clone()),
                i.index.to_kept(),
            ])?;
            Ok(())
        })
        .await
    }

    async fn delete_last_messages(&self, conversation: i64, n: usize) -> Result<u64, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let gone = self
            .call(move |c| {
                // Their pending actions go by the foreign key's cascade.
                c.prepare_cached(
                    "DELETE FROM messages WHERE id IN (
                         SELECT id FROM messages WHERE conversation_id = ?1 ORDER BY id DESC LIMIT ?2)",
                )?
                .execute(params![conversation, n])
            })
            .await?;
        Ok(gone as u64)
    }

    async fn set_item_vectors(&self, tenant: i64, user: i64, items: &[MemoryItem]) -> Result<(), StoreError> {
        type Row = (String, String, i64, String, Option<Vec<u8>>, Option<String>);
        let rows: Vec<Row> = items
            .iter()
            .map(|i| {
                let vector = i.vector.as_ref();
                (
                    encode_namespace(&i.namespace),
                    i.key.clone(),
                    i.updated_at_ms,
                    // As `put_item` wrote it: a rewrite in the same millisecond differs here.
                    Value::Object(i.value.clone()).to_string(),
                    vector.map(ItemVector::to_bytes),
                    vector.map(|v| v.model.clone()),
                )
            })
            .collect();
        self.call(move |c| {
            let tx = c.transaction()?;
            {
                let mut q = tx.prepare_cached(
                    "UPDATE memory_items SET vector = ?5, vector_model = ?6 WHERE tenant_id = ?1 AND user_id = ?2
                     AND namespace = ?3 AND key = ?4 AND updated_at_ms = ?7 AND value = ?8",
                )?;
                for (namespace, key, updated, value, vector, model) in rows {
                    q.execute(params![tenant, user, namespace, key, vector, model, updated, value])?;
                }
            }
            tx.commit()
        })
        .await
    }

    async fn item(
        &self,
        tenant: i64,
        user: i64,
        namespace: &[String],
        key: &str,
        now_ms: i64,
    ) -> Result<Option<MemoryItem>, StoreError> {
        let (namespace, key) = (encode_namespace(namespace), key.to_owned());
        self.call(move |c| {
            c.prepare_cached(&format!(
                "SELECT {ITEM_COLUMNS} FROM memory_items WHERE tenant_id = ?1 AND user_id = ?2 AND namespace = ?3
                 AND key = ?4 AND (expires_at_ms IS NULL OR expires_at_ms > ?5)"
            ))?
            .query_row(params![tenant, user, namespace, key, now_ms], item_row)
            .optional()
        })
        .await
    }

    async fn items(
        &self,
        tenant: i64,
        user: i64,
        prefix: &[String],
        now_ms: i64,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        let (exact, below) = prefix_match(prefix);
        self.call(move |c| {
            let mut q = c.prepare_cached(&format!(
                "SELECT {ITEM_COLUMNS} FROM memory_items WHERE tenant_id = ?1 AND user_id = ?2
                 AND (?3 = '' OR namespace = ?3 OR substr(namespace, 1, length(?4)) = ?4)
                 AND (expires_at_ms IS NULL OR expires_at_ms > ?5)
                 ORDER BY updated_at_ms DESC, namespace, key LIMIT ?6"
            ))?;
            let rows = q.query_map(params![tenant, user, exact, below, now_ms, ITEMS_READ as i64], item_row)?;
            rows.collect()
        })
        .await
    }

    async fn count_items(&self, tenant: i64, user: i64, now_ms: i64) -> Result<u64, StoreError> {
        self.call(move |c| {
            c.prepare_cached(
                "SELECT count(*) FROM memory_items WHERE tenant_id = ?1 AND user_id = ?2
                 AND (expires_at_ms IS NULL OR expires_at_ms > ?3)",
            )?
            .query_row(params![tenant, user, now_ms], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
        })
        .await
    }

    async fn item_namespaces(
        &self,
        tenant: i64,
        user: i64,
        prefix: &[String],
        now_ms: i64,
    ) -> Result<Vec<Vec<String>>, StoreError> {
        let (exact, below) = prefix_match(prefix);
        self.call(move |c| {
            let mut q = c.prepare_cached(
                "SELECT DISTINCT namespace FROM memory_items WHERE tenant_id = ?1 AND user_id = ?2
                 AND (?3 = '' OR namespace = ?3 OR substr(namespace, 1, length(?4)) = ?4)
                 AND (expires_at_ms IS NULL OR expires_at_ms > ?5)
                 ORDER BY namespace LIMIT ?6",
            )?;
            let rows = q.query_map(params![tenant, user, exact, below, now_ms, ITEMS_READ as i64], |r| {
                r.get::<_, String>(0).map(|ns| decode_namespace(&ns))
            })?;
            rows.collect()
        })
        .await
    }

    async fn refresh_items(
        &self,
        tenant: i64,
        user: i64,
        items: &[(Vec<String>, String)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let keys: Vec<(String, String)> = items.iter().map(|(ns, k)| (encode_namespace(ns), k.clone())).collect();
        self.call(move |c| {
            let tx = c.transaction()?;
            {
                let mut q = tx.prepare_cached(
                    "UPDATE memory_items SET expires_at_ms = ?5 + ttl_ms WHERE tenant_id = ?1 AND user_id = ?2
                     AND namespace = ?3 AND key = ?4 AND ttl_ms IS NOT NULL AND expires_at_ms > ?5",
                )?;
                for (namespace, key) in &keys {
                    q.execute(params![tenant, user, namespace, key, now_ms])?;
                }
            }
            tx.commit()
        })
        .await
    }

    async fn delete_item(&self, tenant: i64, user: i64, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        let (namespace, key) = (encode_namespace(namespace), key.to_owned());
        self.call(move |c| {
            let n = c
                .prepare_cached(
                    "DELETE FROM memory_items WHERE tenant_id = ?1 AND user_id = ?2 AND namespace = ?3 AND key = ?4",
                )?
                .execute(params![tenant, user, namespace, key])?;
            Ok(n > 0)
        })
        .await
    }

    async fn prune_items(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.call(move |c| {
            let n = c
                .prepare_cached("DELETE FROM memory_items WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ?1")?
                .execute(params![now_ms])?;
            Ok(n as u64)
        })
        .await
    }

    fn keeps_usage(&self) -> bool {
        true
    }

    async fn record_usage(
        &self,
        tenant: i64,
        user: i64,
        conversation: i64,
        usage: &[TurnUsage],
    ) -> Result<(), StoreError> {
        let usage = usage.to_vec();
        self.call(move |c| {
            let tx = c.transaction()?;
            {
                let mut q = tx.prepare_cached(
                    "INSERT INTO turn_usage (tenant_id, user_id, conversation_id, run_id, agent, model, prompt_tokens,
                         completion_tokens, cached_prompt_tokens, calls, at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )?;
                for u in &usage {
                    q.execute(params![
                        tenant,
                        user,
                        conversation,
                        u.run_id,
                        u.agent,
                        u.model,
                        to_db(u.prompt),
                        to_db(u.completion),
                        to_db(u.cached_prompt),
                        u.calls,
                        u.at_ms
                    ])?;
                }
            }
            tx.commit()
        })
        .await
    }

    async fn conversation_usage(&self, conversation: i64) -> Result<Vec<TurnUsage>, StoreError> {
        self.call(move |c| {
            c.prepare_cached(
                "SELECT run_id, agent, model, prompt_tokens, completion_tokens, cached_prompt_tokens, calls, at_ms
                 FROM turn_usage WHERE conversation_id = ?1 ORDER BY id",
            )?
            .query_map([conversation], |r| {
                Ok(TurnUsage {
                    run_id: r.get(0)?,
                    agent: r.get(1)?,
                    model: r.get(2)?,
                    prompt: from_db(r.get(3)?),
                    completion: from_db(r.get(4)?),
                    cached_prompt: from_db(r.get(5)?),
                    calls: r.get(6)?,
                    at_ms: r.get(7)?,
                })
            })?
            .collect()
        })
        .await
    }

    async fn tenant_tokens_since(&self, tenant: i64, since_ms: i64) -> Result<u64, StoreError> {
        self.call(move |c| {
            c.prepare_cached(
                "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM turn_usage
                 WHERE tenant_id = ?1 AND at_ms >= ?2",
            )?
            .query_row(params![tenant, since_ms], |r| r.get::<_, i64>(0))
            .map(from_db)
        })
        .await
    }

    async fn prune_usage(&self, before_ms: i64, limit: usize) -> Result<u64, StoreError> {
        self.call(move |c| {
            let n = c
                .prepare_cached(
                    "DELETE FROM turn_usage WHERE id IN (SELECT id FROM turn_usage WHERE at_ms < ?1 LIMIT ?2)",
                )?
                .execute(params![before_ms, limit as i64])?;
            Ok(n as u64)
        })
        .await
    }

    async fn claim_pass(&self, task: &str, holder: &str, now_ms: i64, every_ms: i64) -> Result<bool, StoreError> {
        let (task, holder) = (task.to_owned(), holder.to_owned());
        self.call(move |c| {
            let n = c
                .prepare_cached(
                    "INSERT INTO maintenance_passes (task, holder, ran_at_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT (task) DO UPDATE SET holder = excluded.holder, ran_at_ms = excluded.ran_at_ms
                     WHERE maintenance_passes.ran_at_ms <= excluded.ran_at_ms - ?4",
                )?
                .execute(params![task, holder, now_ms, every_ms])?;
            Ok(n == 1)
        })
        .await
    }

    async fn delete_idle_conversations(
        &self,
        rule: &IdleRule,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        let (r, tenants, agents) = (rule.clone(), rule.tenants_json(), rule.agents_json());
        self.call(move |c| {
            c.prepare_cached(
                "DELETE FROM conversations WHERE id IN (
                     SELECT id FROM conversations
                     WHERE (last_active_ms < ?1 OR (last_active_ms IS NULL AND COALESCE(
                               (SELECT MAX(m.created_at_ms) FROM messages m WHERE m.conversation_id = conversations.id),
                               created_at_ms) < ?1))
                       AND (running_run IS NULL OR COALESCE(running_until_ms, running_since_ms + ?2) < ?3)
                       AND (?4 IS NULL OR tenant_id = ?4) AND (?5 IS NULL OR agent = ?5)
                       AND tenant_id NOT IN (SELECT value FROM json_each(?6))
                       AND agent NOT IN (SELECT value FROM json_each(?7))
                     ORDER BY last_active_ms LIMIT ?8)
                 RETURNING tenant_id, id",
            )?
            .query_map(
                params![r.idle_before_ms, LEGACY_CLAIM_MS, now_ms, r.tenant, r.agent, tenants, agents, limit as i64],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )?
            .collect()
        })
        .await
    }

    async fn conversations_active_since(
        &self,
        since_ms: i64,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>, StoreError> {
        self.call(move |c| {
            c.prepare_cached(
                "SELECT tenant_id, id, agent FROM conversations
                 WHERE id > ?2 AND COALESCE(last_active_ms, created_at_ms) >= ?1 ORDER BY id LIMIT ?3",
            )?
            .query_map(params![since_ms, after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect()
        })
        .await
    }

    async fn put_upload(
        &self,
        tenant: i64,
        user: i64,
        id: &str,
        name: &str,
        bytes: &[u8],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (id, name, bytes) = (id.to_owned(), name.to_owned(), bytes.to_vec());
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO uploads (upload_id, tenant_id, user_id, name, bytes, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![id, tenant, user, name, bytes, now_ms])?;
            Ok(())
        })
        .await
    }

    async fn uploads(&self, tenant: i64, user: i64, ids: &[String], since_ms: i64) -> Result<Vec<Upload>, StoreError> {
        let ids = serde_json::Value::from(ids.to_vec()).to_string();
        self.call(move |c| {
            c.prepare_cached(
                "SELECT upload_id, name, bytes FROM uploads WHERE tenant_id = ?1 AND user_id = ?2
                   AND upload_id IN (SELECT value FROM json_each(?3)) AND created_at_ms >= ?4
                 ORDER BY created_at_ms, upload_id",
            )?
            .query_map(params![tenant, user, ids, since_ms], |r| {
                Ok(Upload { id: r.get(0)?, name: r.get(1)?, bytes: r.get(2)? })
            })?
            .collect()
        })
        .await
    }

    async fn delete_uploads(&self, tenant: i64, user: i64, ids: &[String]) -> Result<u64, StoreError> {
        let ids = serde_json::Value::from(ids.to_vec()).to_string();
        self.call(move |c| {
            let n = c
                .prepare_cached(
                    "DELETE FROM uploads WHERE tenant_id = ?1 AND user_id = ?2
                       AND upload_id IN (SELECT value FROM json_each(?3))",
                )?
                .execute(params![tenant, user, ids])?;
            Ok(n as u64)
        })
        .await
    }

    async fn prune_uploads(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.call(move |c| {
            let n = c.prepare_cached("DELETE FROM uploads WHERE created_at_ms < ?1")?.execute([before_ms])?;
            Ok(n as u64)
        })
        .await
    }

    async fn delete_idle_threads(&self, rule: &IdleRule) -> Result<u64, StoreError> {
        if rule.agent.is_some() {
            return Ok(0);
        }
        let (before, tenant, tenants) = (rule.idle_before_ms, rule.tenant, rule.tenants_json());
        self.call(move |c| {
            let n = c
                .prepare_cached(
                    "DELETE FROM threads WHERE conversation_id IS NULL AND updated_at_ms < ?1
                       AND (?2 IS NULL OR tenant_id = ?2) AND tenant_id NOT IN (SELECT value FROM json_each(?3))",
                )?
                .execute(params![before, tenant, tenants])?;
            Ok(n as u64)
        })
        .await
    }
}

/// The columns [`item_row`] reads, in its order.
const ITEM_COLUMNS: &str =
    "namespace, key, value, created_at_ms, updated_at_ms, ttl_ms, expires_at_ms, vector_model, vector, index_fields";

fn item_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MemoryItem> {
    let namespace: String = r.get(0)?;
    let value: String = r.get(2)?;
    // Written by this store as a JSON object; anything else reads as an empty one.
    let value = match serde_json::from_str(&value) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    Ok(MemoryItem {
        namespace: decode_namespace(&namespace),
        key: r.get(1)?,
        value,
        created_at_ms: r.get(3)?,
        updated_at_ms: r.get(4)?,
        ttl_ms: r.get(5)?,
        expires_at_ms: r.get(6)?,
        vector: ItemVector::kept(r.get(7)?, r.get(8)?),
        index: IndexFields::kept(r.get(9)?),
    })
}

/// The columns [`thread_row`] reads, in its order.
const THREAD_COLUMNS: &str = "thread_id, tenant_id, user_id, conversation_id, metadata, created_at_ms, updated_at_ms";

fn thread_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Thread> {
    let metadata: String = r.get(4)?;
    // Written by this store as a JSON object; anything else reads as none.
    let metadata = match serde_json::from_str(&metadata) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    Ok(Thread {
        id: r.get(0)?,
        tenant: r.get(1)?,
        user: r.get(2)?,
        conversation: r.get(3)?,
        metadata,
        created_at_ms: r.get(5)?,
        updated_at_ms: r.get(6)?,
    })
}
