//! [`PostgresConversationStore`]: the conversation store in PostgreSQL, shared by replicas;
//! its tables live beside the checkpoints, so a step's messages commit with its record.

use crate::items::{ITEMS_READ, IndexFields, ItemVector, MemoryItem, decode_namespace, encode_namespace, prefix_match};
use crate::retention::IdleRule;
use crate::usage::{TurnUsage, from_db, to_db};
use crate::{
    Conversation, ConversationStore, ConversationSummary, Decided, LEGACY_CLAIM_MS, NewPending, PendingAction,
    PendingLookup, ReleasedTurn, Role, StoreError, StoredMessage, THREADS_READ, Thread, TurnClaim, Upload, now_ms,
    summary_title,
};
use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};
use toolgraph_graph::PgDatabase;

/// Conversations, messages and pending actions in PostgreSQL (deletes cascade).
#[derive(Debug, Clone)]
pub struct PostgresConversationStore {
    db: PgDatabase,
}

impl PostgresConversationStore {
    /// Migrates `pool` (direct connections, shared with the checkpointer) and wraps it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn new(pool: PgPool) -> Result<Self, StoreError> {
        Self::open(PgDatabase::direct(pool)).await
    }

    /// Migrates `db` (shared with the checkpointer; possibly behind a pooler in transaction
    /// mode) and wraps it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn open(db: PgDatabase) -> Result<Self, StoreError> {
        let m = crate::postgres_migrator().await?;
        db.migrate(&m).await.map_err(|e| StoreError(format!("migration failed: {e}")))?;
        Ok(Self { db })
    }
}

const PENDING_COLUMNS: &str = "message_id, conversation_id, run_id, interrupt_id, tool_name, description, arguments::text AS arguments, decision, response";

fn pending_from_row(r: &PgRow) -> PendingAction {
    PendingAction {
        message_id: r.get("message_id"),
        action: NewPending {
            conversation_id: r.get("conversation_id"),
            run_id: r.get("run_id"),
            interrupt_id: r.get("interrupt_id"),
            tool_name: r.get("tool_name"),
            description: r.get("description"),
            arguments: serde_json::from_str(r.get::<&str, _>("arguments")).unwrap_or(Value::Null),
        },
        decision: r.get("decision"),
        response: r.get("response"),
    }
}

/// Inserts a message through `conn` (a pooled connection or a caller's transaction);
/// `persistent` as [`PgDatabase::persistent`] says.
pub(crate) async fn insert_message(
    conn: &mut sqlx::PgConnection,
    persistent: bool,
    conversation: i64,
    role: Role,
    content: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO messages (conversation_id, role, content, created_at_ms) VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(conversation)
    .bind(role.as_str())
    .bind(content)
    .bind(now_ms())
    .persistent(persistent)
    .fetch_one(&mut *conn)
    .await
}

/// Inserts a pending action and its message in one statement through `conn`.
pub(crate) async fn insert_pending(
    conn: &mut sqlx::PgConnection,
    persistent: bool,
    p: &NewPending,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "WITH m AS (
             INSERT INTO messages (conversation_id, role, content, created_at_ms)
             VALUES ($1, 'pending', $5, $7) RETURNING id
         )
         INSERT INTO pending_actions (message_id, conversation_id, run_id, interrupt_id, tool_name, description, arguments)
         SELECT id, $1, $2, $3, $4, $5, $6::jsonb FROM m RETURNING message_id",
    )
    .bind(p.conversation_id)
    .bind(&p.run_id)
    .bind(&p.interrupt_id)
    .bind(&p.tool_name)
    .bind(&p.description)
    .bind(p.arguments.to_string())
    .bind(now_ms())
    .persistent(persistent)
    .fetch_one(&mut *conn)
    .await
}

/// A freed or taken-over claim: tenant, conversation, agent, user, the run that held it.
fn released_turn(r: &PgRow) -> ReleasedTurn {
    ReleasedTurn {
        tenant_id: r.get(0),
        conversation_id: r.get(1),
        agent: r.get(2),
        user_id: r.get(3),
        run_id: r.get::<Option<String>, _>(4).unwrap_or_default(),
    }
}

#[async_trait]
impl ConversationStore for PostgresConversationStore {
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError> {
        let mut s = self.db.session().await?;
        let id = sqlx::query_scalar(
            "INSERT INTO conversations (tenant_id, user_id, agent, created_at_ms, last_active_ms)
             VALUES ($1, $2, $3, $4, $4) RETURNING id",
        )
        .bind(tenant)
        .bind(user)
        .bind(agent)
        .bind(now_ms())
        .persistent(self.db.persistent())
        .fetch_one(&mut *s)
        .await?;
        s.finish().await?;
        Ok(id)
    }

    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError> {
        let mut s = self.db.session().await?;
        let row = sqlx::query("SELECT id, agent FROM conversations WHERE id = $1 AND tenant_id = $2 AND user_id = $3")
            .bind(id)
            .bind(tenant)
            .bind(user)
            .persistent(self.db.persistent())
            .fetch_optional(&mut *s)
            .await?;
        s.finish().await?;
        Ok(row.map(|r| Conversation { id: r.get(0), agent: r.get(1) }))
    }

    async fn list_conversations(
        &self,
        tenant: i64,
        user: i64,
        limit: usize,
    ) -> Result<Vec<ConversationSummary>, StoreError> {
        let mut s = self.db.session().await?;
        let rows = sqlx::query(
            "SELECT c.id, c.agent, (SELECT m.content FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user'
                                    ORDER BY m.id LIMIT 1)
             FROM conversations c WHERE c.tenant_id = $1 AND c.user_id = $2 ORDER BY c.id DESC LIMIT $3",
        )
        .bind(tenant)
        .bind(user)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(rows
            .iter()
            .map(|r| ConversationSummary {
                id: r.get(0),
                agent: r.get(1),
                title: summary_title(&r.get::<Option<String>, _>(2).unwrap_or_default()),
            })
            .collect())
    }

    async fn begin_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        let n = sqlx::query(
            "UPDATE conversations SET running_run = $1, running_owner = $2, running_since_ms = $3,
                    running_until_ms = $3 + $4, last_active_ms = $3
             WHERE id = $5 AND (running_run IS NULL OR COALESCE(running_until_ms, running_since_ms + $6) < $3)",
        )
        .bind(&claim.run_id)
        .bind(&claim.owner)
        .bind(now_ms())
        .bind(claim.lease_ms)
        .bind(conversation)
        .bind(LEGACY_CLAIM_MS)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?
        .rows_affected();
        s.finish().await?;
        Ok(n == 1)
    }

    async fn renew_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        let n = sqlx::query("UPDATE conversations SET running_until_ms = $1 WHERE id = $2 AND running_run = $3")
            .bind(now_ms() + claim.lease_ms)
            .bind(conversation)
            .bind(&claim.run_id)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?
            .rows_affected();
        s.finish().await?;
        Ok(n == 1)
    }

    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError> {
        let mut s = self.db.session().await?;
        sqlx::query(
            "UPDATE conversations SET running_run = NULL, running_owner = NULL, running_since_ms = NULL,
                    running_until_ms = NULL, last_active_ms = $3
             WHERE id = $1 AND running_run = $2",
        )
        .bind(conversation)
        .bind(run_id)
        .bind(now_ms())
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(())
    }

    async fn release_owner(&self, owner: &str) -> Result<Vec<ReleasedTurn>, StoreError> {
        let mut s = self.db.session().await?;
        let rows = sqlx::query(
            "UPDATE conversations SET running_run = NULL, running_owner = NULL, running_since_ms = NULL,
                    running_until_ms = NULL
             FROM (SELECT id, running_run FROM conversations WHERE running_owner = $1 FOR UPDATE) old
             WHERE conversations.id = old.id
             RETURNING conversations.tenant_id, conversations.id, conversations.agent, conversations.user_id,
                       old.running_run",
        )
        .bind(owner)
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(rows.iter().map(released_turn).collect())
    }

    async fn take_over_expired(&self, claim: &TurnClaim, limit: usize) -> Result<Vec<ReleasedTurn>, StoreError> {
        let mut s = self.db.session().await?;
        // SKIP LOCKED: replicas sweeping at once split the expired conversations between them.
        let rows = sqlx::query(
            "UPDATE conversations SET running_run = $1, running_owner = $2, running_since_ms = $3,
                    running_until_ms = $3 + $4
             FROM (SELECT id, running_run FROM conversations
                   WHERE running_run IS NOT NULL AND COALESCE(running_until_ms, running_since_ms + $5) < $3
                   ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED) old
             WHERE conversations.id = old.id
             RETURNING conversations.tenant_id, conversations.id, conversations.agent, conversations.user_id,
                       old.running_run",
        )
        .bind(&claim.run_id)
        .bind(&claim.owner)
        .bind(now_ms())
        .bind(claim.lease_ms)
        .bind(LEGACY_CLAIM_MS)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(rows.iter().map(released_turn).collect())
    }

    async fn add_message(&self, conversation: i64, role: Role, content: &str) -> Result<i64, StoreError> {
        let mut s = self.db.session().await?;
        let id = insert_message(&mut s, self.db.persistent(), conversation, role, content).await?;
        s.finish().await?;
        Ok(id)
    }

    async fn add_pending(&self, pending: &NewPending) -> Result<i64, StoreError> {
        let mut s = self.db.session().await?;
        let id = insert_pending(&mut s, self.db.persistent(), pending).await?;
        s.finish().await?;
        Ok(id)
    }

    async fn pending(&self, lookup: &PendingLookup) -> Result<Option<PendingAction>, StoreError> {
        let mut s = self.db.session().await?;
        let row = sqlx::query(&format!(
            "SELECT {PENDING_COLUMNS} FROM pending_actions p
             WHERE p.message_id = $1 AND p.conversation_id = $2
               AND EXISTS (SELECT 1 FROM conversations c WHERE c.id = p.conversation_id AND c.tenant_id = $3 AND c.user_id = $4)"
        ))
        .bind(lookup.message_id)
        .bind(lookup.conversation_id)
        .bind(lookup.tenant_id)
        .bind(lookup.user_id)
        .persistent(self.db.persistent())
            .fetch_optional(&mut *s)
        .await?;
        s.finish().await?;
        Ok(row.as_ref().map(pending_from_row))
    }

    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError> {
        let mut s = self.db.session().await?;
        let rows = sqlx::query(&format!(
            "SELECT {PENDING_COLUMNS} FROM pending_actions WHERE conversation_id = $1 AND run_id = $2 ORDER BY message_id"
        ))
        .bind(conversation)
        .bind(run_id)
        .persistent(self.db.persistent())
            .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(rows.iter().map(pending_from_row).collect())
    }

    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError> {
        let mut s = self.db.session().await?;
        let n = sqlx::query("UPDATE pending_actions SET decision = $1 WHERE message_id = $2 AND decision IS NULL")
            .bind(approve)
            .bind(message_id)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?
            .rows_affected();
        if n == 1 {
            s.finish().await?;
            return Ok(Decided::Recorded);
        }
        let prev: Option<bool> = sqlx::query_scalar("SELECT decision FROM pending_actions WHERE message_id = $1")
            .bind(message_id)
            .persistent(self.db.persistent())
            .fetch_one(&mut *s)
            .await?;
        s.finish().await?;
        Ok(if prev == Some(approve) { Decided::Same } else { Decided::Conflict })
    }

    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError> {
        let mut s = self.db.session().await?;
        sqlx::query("UPDATE pending_actions SET response = $1 WHERE conversation_id = $2 AND run_id = $3")
            .bind(response)
            .bind(conversation)
            .bind(run_id)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?;
        s.finish().await?;
        Ok(())
    }

    async fn messages(&self, conversation: i64) -> Result<Vec<StoredMessage>, StoreError> {
        let mut s = self.db.session().await?;
        let rows = sqlx::query("SELECT id, role, content FROM messages WHERE conversation_id = $1 ORDER BY id")
            .bind(conversation)
            .persistent(self.db.persistent())
            .fetch_all(&mut *s)
            .await?;
        s.finish().await?;
        rows.iter()
            .map(|r| {
                let name: &str = r.get(1);
                let role = Role::parse(name).ok_or_else(|| StoreError(format!("unknown message role '{name}'")))?;
                Ok(StoredMessage { id: r.get(0), role, content: r.get(2) })
            })
            .collect()
    }

    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        let n = sqlx::query("DELETE FROM conversations WHERE id = $1 AND tenant_id = $2 AND user_id = $3")
            .bind(id)
            .bind(tenant)
            .bind(user)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?
            .rows_affected();
        s.finish().await?;
        Ok(n == 1)
    }

    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError> {
        let mut s = self.db.session().await?;
        for table in ["threads", "memory_items", "turn_usage", "uploads"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE tenant_id = $1 AND user_id = $2"))
                .bind(tenant)
                .bind(user)
                .persistent(self.db.persistent())
                .execute(&mut *s)
                .await?;
        }
        let ids = sqlx::query_scalar("DELETE FROM conversations WHERE tenant_id = $1 AND user_id = $2 RETURNING id")
            .bind(tenant)
            .bind(user)
            .persistent(self.db.persistent())
            .fetch_all(&mut *s)
            .await?;
        s.finish().await?;
        Ok(ids)
    }

    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError> {
        let mut s = self.db.session().await?;
        for table in ["threads", "memory_items", "turn_usage", "uploads"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE tenant_id = $1"))
                .bind(tenant)
                .persistent(self.db.persistent())
                .execute(&mut *s)
                .await?;
        }
        let ids = sqlx::query_scalar("DELETE FROM conversations WHERE tenant_id = $1 RETURNING id")
            .bind(tenant)
            .persistent(self.db.persistent())
            .fetch_all(&mut *s)
            .await?;
        s.finish().await?;
        Ok(ids)
    }

    fn keeps_threads(&self) -> bool {
        true
    }

    async fn create_thread(&self, thread: &Thread) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        let n = sqlx::query(
            "INSERT INTO threads (thread_id, tenant_id, user_id, conversation_id, metadata, created_at_ms, updated_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, user_id, thread_id) DO NOTHING",
        )
        .bind(&thread.id)
        .bind(thread.tenant)
        .bind(thread.user)
        .bind(thread.conversation)
        .bind(Value::Object(thread.metadata.clone()))
        .bind(thread.created_at_ms)
        .bind(thread.updated_at_ms)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?
        .rows_affected();
        s.finish().await?;
        Ok(n == 1)
    }

    async fn thread(&self, tenant: i64, user: i64, id: &str) -> Result<Option<Thread>, StoreError> {
        let mut s = self.db.session().await?;
        let row = sqlx::query(&format!(
            "SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = $1 AND tenant_id = $2 AND user_id = $3"
        ))
        .bind(id)
        .bind(tenant)
        .bind(user)
        .persistent(self.db.persistent())
        .fetch_optional(&mut *s)
        .await?;
        s.finish().await?;
        row.as_ref().map(thread_row).transpose()
    }

    async fn threads(&self, tenant: i64, user: i64) -> Result<Vec<Thread>, StoreError> {
        let mut s = self.db.session().await?;
        let rows = sqlx::query(&format!(
            "SELECT {THREAD_COLUMNS} FROM threads WHERE tenant_id = $1 AND user_id = $2
             ORDER BY updated_at_ms DESC, thread_id DESC LIMIT $3"
        ))
        .bind(tenant)
        .bind(user)
        .bind(THREADS_READ as i64)
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        rows.iter().map(thread_row).collect()
    }

    async fn update_thread(
        &self,
        tenant: i64,
        user: i64,
        id: &str,
        metadata: Option<&serde_json::Map<String, Value>>,
        conversation: Option<i64>,
    ) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        let n = sqlx::query(
            "UPDATE threads SET metadata = COALESCE($4, metadata),
                 conversation_id = COALESCE(conversation_id, $5),
                 updated_at_ms = GREATEST($6, updated_at_ms + 1)
             WHERE thread_id = $1 AND tenant_id = $2 AND user_id = $3",
        )
        .bind(id)
        .bind(tenant)
        .bind(user)
        .bind(metadata.map(|m| Value::Object(m.clone())))
        .bind(conversation)
        .bind(now_ms())
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?
        .rows_affected();
        s.finish().await?;
        Ok(n == 1)
    }

    async fn rebind_thread(&self, tenant: i64, user: i64, id: &str, from: i64, to: i64) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        // One statement: the move and its branch record commit together.
        let moved: i64 = sqlx::query_scalar(
            "WITH moved AS (
                 UPDATE threads SET conversation_id = $5, updated_at_ms = GREATEST($6, updated_at_ms + 1)
                 WHERE thread_id = $1 AND tenant_id = $2 AND user_id = $3 AND conversation_id = $4
                   AND EXISTS (SELECT 1 FROM conversations WHERE id = $5 AND tenant_id = $2 AND user_id = $3)
                 RETURNING 1
             ), kept AS (
                 INSERT INTO thread_branches (tenant_id, user_id, thread_id, conversation_id)
                 SELECT $2, $3, $1, $4 FROM moved ON CONFLICT DO NOTHING
             ), current AS (
                 DELETE FROM thread_branches
                 WHERE tenant_id = $2 AND user_id = $3 AND thread_id = $1 AND conversation_id = $5
                   AND EXISTS (SELECT 1 FROM moved)
             )
             SELECT count(*) FROM moved",
        )
        .bind(id)
        .bind(tenant)
        .bind(user)
        .bind(from)
        .bind(to)
        .bind(now_ms())
        .persistent(self.db.persistent())
        .fetch_one(&mut *s)
        .await?;
        s.finish().await?;
        Ok(moved == 1)
    }

    async fn thread_branches(&self, tenant: i64, user: i64, id: &str) -> Result<Vec<i64>, StoreError> {
        let mut s = self.db.session().await?;
        let ids = sqlx::query_scalar(
            "SELECT conversation_id FROM thread_branches
             WHERE tenant_id = $1 AND user_id = $2 AND thread_id = $3 ORDER BY conversation_id",
        )
        .bind(tenant)
        .bind(user)
        .bind(id)
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(ids)
    }

    async fn delete_thread(&self, tenant: i64, user: i64, id: &str) -> Result<Option<Thread>, StoreError> {
        let mut s = self.db.session().await?;
        sqlx::query("DELETE FROM thread_branches WHERE thread_id = $1 AND tenant_id = $2 AND user_id = $3")
            .bind(id)
            .bind(tenant)
            .bind(user)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?;
        let row = sqlx::query(&format!(
            "DELETE FROM threads WHERE thread_id = $1 AND tenant_id = $2 AND user_id = $3 RETURNING {THREAD_COLUMNS}"
        ))
        .bind(id)
        .bind(tenant)
        .bind(user)
        .persistent(self.db.persistent())
        .fetch_optional(&mut *s)
        .await?;
        s.finish().await?;
        row.as_ref().map(thread_row).transpose()
    }

    async fn put_item(&self, tenant: i64, user: i64, item: &MemoryItem) -> Result<(), StoreError> {
        let mut s = self.db.session().await?;
        sqlx::query(
            "INSERT INTO memory_items (tenant_id, user_id, namespace, key, value, created_at_ms, updated_at_ms, ttl_ms, expires_at_ms,
                                       vector, vector_model, index_fields)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (tenant_id, user_id, namespace, key) DO UPDATE SET
               value = excluded.value, updated_at_ms = excluded.updated_at_ms, ttl_ms = excluded.ttl_ms,
               expires_at_ms = excluded.expires_at_ms, vector = excluded.vector, vector_model = excluded.vector_model,
                   index_fields = excluded.index_fields,
               created_at_ms = CASE WHEN memory_items.expires_at_ms IS NOT NULL
                                     AND memory_items.expires_at_ms <= excluded.updated_at_ms
                                    THEN excluded.created_at_ms ELSE memory_items.created_at_ms END",
        )
        .bind(tenant)
        .bind(user)
        .bind(encode_namespace(&item.namespace))
        .bind(&item.key)
        .bind(Value::Object(item.value.clone()))
        .bind(item.created_at_ms)
        .bind(item.updated_at_ms)
        .bind(item.ttl_ms)
        .bind(item.expires_at_ms)
        .bind(item.vector.as_ref().map(ItemVector::to_bytes))
        .bind(item.vector.as_ref().map(|v| v.model.clone()))
        .bind(item.index.to_kept())
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(())
    }

    async fn delete_last_messages(&self, conversation: i64, n: usize) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        // Their pending actions go by the foreign key's cascade.
        let gone = sqlx::query(
            "DELETE FROM messages WHERE id IN (
                 SELECT id FROM messages WHERE conversation_id = $1 ORDER BY id DESC LIMIT $2)",
        )
        .bind(conversation)
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?
        .rows_affected();
        s.finish().await?;
        Ok(gone)
    }

    async fn set_item_vectors(&self, tenant: i64, user: i64, items: &[MemoryItem]) -> Result<(), StoreError> {
        let embedded: Vec<(&MemoryItem, &ItemVector)> =
            items.iter().filter_map(|i| i.vector.as_ref().map(|v| (i, v))).collect();
        if embedded.is_empty() {
            return Ok(());
        }
        let namespaces: Vec<String> = embedded.iter().map(|(i, _)| encode_namespace(&i.namespace)).collect();
        let keys: Vec<String> = embedded.iter().map(|(i, _)| i.key.clone()).collect();
        let written: Vec<i64> = embedded.iter().map(|(i, _)| i.updated_at_ms).collect();
        let vectors: Vec<Vec<u8>> = embedded.iter().map(|(_, v)| v.to_bytes()).collect();
        let models: Vec<String> = embedded.iter().map(|(_, v)| v.model.clone()).collect();
        // What was embedded: a rewrite in the same millisecond differs here.
        let values: Vec<Value> = embedded.iter().map(|(i, _)| Value::Object(i.value.clone())).collect();
        let mut s = self.db.session().await?;
        sqlx::query(
            "UPDATE memory_items m SET vector = u.vector, vector_model = u.model
             FROM unnest($3::text[], $4::text[], $5::bigint[], $6::bytea[], $7::text[], $8::jsonb[])
                  AS u(namespace, key, written, vector, model, value)
             WHERE m.tenant_id = $1 AND m.user_id = $2 AND m.namespace = u.namespace AND m.key = u.key
               AND m.updated_at_ms = u.written AND m.value = u.value",
        )
        .bind(tenant)
        .bind(user)
        .bind(namespaces)
        .bind(keys)
        .bind(written)
        .bind(vectors)
        .bind(models)
        .bind(values)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(())
    }

    async fn item(
        &self,
        tenant: i64,
        user: i64,
        namespace: &[String],
        key: &str,
        now_ms: i64,
    ) -> Result<Option<MemoryItem>, StoreError> {
        let mut s = self.db.session().await?;
        let row = sqlx::query(&format!(
            "SELECT {ITEM_COLUMNS} FROM memory_items WHERE tenant_id = $1 AND user_id = $2 AND namespace = $3
             AND key = $4 AND (expires_at_ms IS NULL OR expires_at_ms > $5)"
        ))
        .bind(tenant)
        .bind(user)
        .bind(encode_namespace(namespace))
        .bind(key)
        .bind(now_ms)
        .persistent(self.db.persistent())
        .fetch_optional(&mut *s)
        .await?;
        s.finish().await?;
        row.as_ref().map(item_row).transpose()
    }

    async fn items(
        &self,
        tenant: i64,
        user: i64,
        prefix: &[String],
        now_ms: i64,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        let (exact, below) = prefix_match(prefix);
        let mut s = self.db.session().await?;
        let rows = sqlx::query(&format!(
            "SELECT {ITEM_COLUMNS} FROM memory_items WHERE tenant_id = $1 AND user_id = $2
             AND ($3 = '' OR namespace = $3 OR left(namespace, length($4)) = $4)
             AND (expires_at_ms IS NULL OR expires_at_ms > $5)
             ORDER BY updated_at_ms DESC, namespace COLLATE \"C\", key COLLATE \"C\" LIMIT $6"
        ))
        .bind(tenant)
        .bind(user)
        .bind(exact)
        .bind(below)
        .bind(now_ms)
        .bind(ITEMS_READ as i64)
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        rows.iter().map(item_row).collect()
    }

    async fn count_items(&self, tenant: i64, user: i64, now_ms: i64) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM memory_items WHERE tenant_id = $1 AND user_id = $2
             AND (expires_at_ms IS NULL OR expires_at_ms > $3)",
        )
        .bind(tenant)
        .bind(user)
        .bind(now_ms)
        .persistent(self.db.persistent())
        .fetch_one(&mut *s)
        .await?;
        s.finish().await?;
        Ok(n.max(0) as u64)
    }

    async fn item_namespaces(
        &self,
        tenant: i64,
        user: i64,
        prefix: &[String],
        now_ms: i64,
    ) -> Result<Vec<Vec<String>>, StoreError> {
        let (exact, below) = prefix_match(prefix);
        let mut s = self.db.session().await?;
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT namespace COLLATE \"C\" FROM memory_items WHERE tenant_id = $1 AND user_id = $2
             AND ($3 = '' OR namespace = $3 OR left(namespace, length($4)) = $4)
             AND (expires_at_ms IS NULL OR expires_at_ms > $5)
             ORDER BY 1 LIMIT $6",
        )
        .bind(tenant)
        .bind(user)
        .bind(exact)
        .bind(below)
        .bind(now_ms)
        .bind(ITEMS_READ as i64)
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(found.iter().map(|ns| decode_namespace(ns)).collect())
    }

    async fn refresh_items(
        &self,
        tenant: i64,
        user: i64,
        items: &[(Vec<String>, String)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let namespaces: Vec<String> = items.iter().map(|(ns, _)| encode_namespace(ns)).collect();
        let keys: Vec<String> = items.iter().map(|(_, k)| k.clone()).collect();
        let mut s = self.db.session().await?;
        sqlx::query(
            "UPDATE memory_items SET expires_at_ms = $3 + ttl_ms WHERE tenant_id = $1 AND user_id = $2
             AND ttl_ms IS NOT NULL AND expires_at_ms > $3
             AND (namespace, key) IN (SELECT * FROM unnest($4::text[], $5::text[]))",
        )
        .bind(tenant)
        .bind(user)
        .bind(now_ms)
        .bind(namespaces)
        .bind(keys)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(())
    }

    async fn delete_item(&self, tenant: i64, user: i64, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        let done = sqlx::query(
            "DELETE FROM memory_items WHERE tenant_id = $1 AND user_id = $2 AND namespace = $3 AND key = $4",
        )
        .bind(tenant)
        .bind(user)
        .bind(encode_namespace(namespace))
        .bind(key)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(done.rows_affected() > 0)
    }

    async fn prune_items(&self, now_ms: i64) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        let done = sqlx::query("DELETE FROM memory_items WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= $1")
            .bind(now_ms)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?;
        s.finish().await?;
        Ok(done.rows_affected())
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
        if usage.is_empty() {
            return Ok(());
        }
        // One statement for every model of the turn.
        let mut q = sqlx::QueryBuilder::new(
            "INSERT INTO turn_usage (tenant_id, user_id, conversation_id, run_id, agent, model, prompt_tokens,
                 completion_tokens, cached_prompt_tokens, calls, at_ms) ",
        );
        q.push_values(usage, |mut row, u| {
            row.push_bind(tenant)
                .push_bind(user)
                .push_bind(conversation)
                .push_bind(&u.run_id)
                .push_bind(&u.agent)
                .push_bind(&u.model)
                .push_bind(to_db(u.prompt))
                .push_bind(to_db(u.completion))
                .push_bind(to_db(u.cached_prompt))
                .push_bind(i32::try_from(u.calls).unwrap_or(i32::MAX))
                .push_bind(u.at_ms);
        });
        let mut s = self.db.session().await?;
        q.build().persistent(self.db.persistent()).execute(&mut *s).await?;
        s.finish().await?;
        Ok(())
    }

    async fn conversation_usage(&self, conversation: i64) -> Result<Vec<TurnUsage>, StoreError> {
        let mut s = self.db.session().await?;
        let rows = sqlx::query(
            "SELECT run_id, agent, model, prompt_tokens, completion_tokens, cached_prompt_tokens, calls, at_ms
             FROM turn_usage WHERE conversation_id = $1 ORDER BY id",
        )
        .bind(conversation)
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        rows.iter()
            .map(|r| {
                Ok(TurnUsage {
                    run_id: r.try_get(0)?,
                    agent: r.try_get(1)?,
                    model: r.try_get(2)?,
                    prompt: from_db(r.try_get(3)?),
                    completion: from_db(r.try_get(4)?),
                    cached_prompt: from_db(r.try_get(5)?),
                    calls: u32::try_from(r.try_get::<i32, _>(6)?).unwrap_or(0),
                    at_ms: r.try_get(7)?,
                })
            })
            .collect()
    }

    async fn tenant_tokens_since(&self, tenant: i64, since_ms: i64) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        let spent: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0)::BIGINT FROM turn_usage
             WHERE tenant_id = $1 AND at_ms >= $2",
        )
        .bind(tenant)
        .bind(since_ms)
        .persistent(self.db.persistent())
        .fetch_one(&mut *s)
        .await?;
        s.finish().await?;
        Ok(from_db(spent))
    }

    async fn prune_usage(&self, before_ms: i64, limit: usize) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        let done =
            sqlx::query("DELETE FROM turn_usage WHERE id IN (SELECT id FROM turn_usage WHERE at_ms < $1 LIMIT $2)")
                .bind(before_ms)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .persistent(self.db.persistent())
                .execute(&mut *s)
                .await?;
        s.finish().await?;
        Ok(done.rows_affected())
    }

    async fn claim_pass(&self, task: &str, holder: &str, now_ms: i64, every_ms: i64) -> Result<bool, StoreError> {
        let mut s = self.db.session().await?;
        let done = sqlx::query(
            "INSERT INTO maintenance_passes (task, holder, ran_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (task) DO UPDATE SET holder = excluded.holder, ran_at_ms = excluded.ran_at_ms
             WHERE maintenance_passes.ran_at_ms <= excluded.ran_at_ms - $4",
        )
        .bind(task)
        .bind(holder)
        .bind(now_ms)
        .bind(every_ms)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_idle_conversations(
        &self,
        rule: &IdleRule,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        // The conditions are checked again on the rows the delete locks: a turn that began
        // between the choice and the delete keeps its conversation.
        const IDLE: &str = "(last_active_ms < $1 OR (last_active_ms IS NULL AND COALESCE(
                   (SELECT MAX(m.created_at_ms) FROM messages m WHERE m.conversation_id = conversations.id),
                   created_at_ms) < $1))
               AND (running_run IS NULL OR COALESCE(running_until_ms, running_since_ms + $2) < $3)
               AND ($4::BIGINT IS NULL OR tenant_id = $4) AND ($5::TEXT IS NULL OR agent = $5)
               AND NOT (tenant_id = ANY($6)) AND NOT (agent = ANY($7))";
        let mut s = self.db.session().await?;
        let rows: Vec<(i64, i64)> = sqlx::query_as(&format!(
            "DELETE FROM conversations WHERE id IN (
                 SELECT id FROM conversations WHERE {IDLE} ORDER BY last_active_ms LIMIT $8 FOR UPDATE SKIP LOCKED)
               AND {IDLE}
             RETURNING tenant_id, id"
        ))
        .bind(rule.idle_before_ms)
        .bind(LEGACY_CLAIM_MS)
        .bind(now_ms)
        .bind(rule.tenant)
        .bind(rule.agent.as_deref())
        .bind(&rule.except_tenants)
        .bind(&rule.except_agents)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(rows)
    }

    async fn conversations_active_since(
        &self,
        since_ms: i64,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, i64, String)>, StoreError> {
        let mut s = self.db.session().await?;
        let rows: Vec<(i64, i64, String)> = sqlx::query_as(
            "SELECT tenant_id, id, agent FROM conversations
             WHERE id > $2 AND COALESCE(last_active_ms, created_at_ms) >= $1 ORDER BY id LIMIT $3",
        )
        .bind(since_ms)
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(rows)
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
        let mut s = self.db.session().await?;
        sqlx::query(
            "INSERT INTO uploads (upload_id, tenant_id, user_id, name, bytes, created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(tenant)
        .bind(user)
        .bind(name)
        .bind(bytes)
        .bind(now_ms)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(())
    }

    async fn uploads(&self, tenant: i64, user: i64, ids: &[String], since_ms: i64) -> Result<Vec<Upload>, StoreError> {
        let mut s = self.db.session().await?;
        let rows: Vec<(String, String, Vec<u8>)> = sqlx::query_as(
            "SELECT upload_id, name, bytes FROM uploads WHERE tenant_id = $1 AND user_id = $2
               AND upload_id = ANY($3) AND created_at_ms >= $4 ORDER BY created_at_ms, upload_id",
        )
        .bind(tenant)
        .bind(user)
        .bind(ids)
        .bind(since_ms)
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        s.finish().await?;
        Ok(rows.into_iter().map(|(id, name, bytes)| Upload { id, name, bytes }).collect())
    }

    async fn delete_uploads(&self, tenant: i64, user: i64, ids: &[String]) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        let done = sqlx::query("DELETE FROM uploads WHERE tenant_id = $1 AND user_id = $2 AND upload_id = ANY($3)")
            .bind(tenant)
            .bind(user)
            .bind(ids)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?;
        s.finish().await?;
        Ok(done.rows_affected())
    }

    async fn prune_uploads(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        let done = sqlx::query("DELETE FROM uploads WHERE created_at_ms < $1")
            .bind(before_ms)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?;
        s.finish().await?;
        Ok(done.rows_affected())
    }

    async fn delete_idle_threads(&self, rule: &IdleRule) -> Result<u64, StoreError> {
        if rule.agent.is_some() {
            return Ok(0);
        }
        let mut s = self.db.session().await?;
        let done = sqlx::query(
            "DELETE FROM threads WHERE conversation_id IS NULL AND updated_at_ms < $1
               AND ($2::BIGINT IS NULL OR tenant_id = $2) AND NOT (tenant_id = ANY($3))",
        )
        .bind(rule.idle_before_ms)
        .bind(rule.tenant)
        .bind(&rule.except_tenants)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(done.rows_affected())
    }
}

/// The columns [`item_row`] reads, in its order.
const ITEM_COLUMNS: &str =
    "namespace, key, value, created_at_ms, updated_at_ms, ttl_ms, expires_at_ms, vector_model, vector, index_fields";

fn item_row(r: &PgRow) -> Result<MemoryItem, StoreError> {
    let namespace: String = r.try_get(0)?;
    let value = match r.try_get::<Value, _>(2)? {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    Ok(MemoryItem {
        namespace: decode_namespace(&namespace),
        key: r.try_get(1)?,
        value,
        created_at_ms: r.try_get(3)?,
        updated_at_ms: r.try_get(4)?,
        ttl_ms: r.try_get(5)?,
        expires_at_ms: r.try_get(6)?,
        vector: ItemVector::kept(r.try_get(7)?, r.try_get(8)?),
        index: IndexFields::kept(r.try_get(9)?),
    })
}

/// The columns [`thread_row`] reads, in its order.
const THREAD_COLUMNS: &str = "thread_id, tenant_id, user_id, conversation_id, metadata, created_at_ms, updated_at_ms";

fn thread_row(r: &PgRow) -> Result<Thread, StoreError> {
    let metadata = match r.try_get::<Value, _>(4)? {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    Ok(Thread {
        id: r.try_get(0)?,
        tenant: r.try_get(1)?,
        user: r.try_get(2)?,
        conversation: r.try_get(3)?,
        metadata,
        created_at_ms: r.try_get(5)?,
        updated_at_ms: r.try_get(6)?,
    })
}
