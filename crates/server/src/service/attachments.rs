//! Documents in the conversation (docs/service.md, "Documents in the conversation"): a person
//! uploads a document, the store keeps it until a turn names it (any replica may run that
//! turn), and the turn ingests it into its conversation's own knowledge base, which the
//! agent's `rag_search` reads beside the agent's. The knowledge base goes with the
//! conversation — deleted by its person, with them or their tenant, or by retention.

use super::ChatService;
use crate::auth::Principal;
use crate::error::ChatError;
use serde::Serialize;
use std::sync::Arc;
use toolgraph_conversations::{TurnClaim, Upload};
use toolgraph_rag::{IngestOptions, KbStore, NamedBytes, Retriever, attached};

/// Where attached documents are kept and how they are embedded.
#[derive(Clone)]
pub struct Attachments {
    /// Their own store, apart from the tenants' knowledge bases (nobody lists or searches it
    /// but the conversation's `rag_search`).
    pub store: Arc<KbStore>,
    /// The embedding model of the agents' searches, so the attachments are searched as the
    /// agent's own documents are.
    pub retriever: Retriever,
}

/// The largest document a person may upload.
pub const MAX_UPLOAD_BYTES: usize = 8 << 20;
/// Most documents one turn attaches.
pub const MAX_ATTACHED_PER_TURN: usize = 8;
/// An upload no turn attached is deleted after a day.
pub const UPLOAD_KEPT_MS: i64 = 86_400_000;
/// The file types an upload may be, by extension.
const TYPES: [&str; 10] = ["md", "markdown", "txt", "text", "html", "htm", "pdf", "json", "jsonl", "ndjson"];

/// What an upload kept.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UploadReceipt {
    /// What a turn names to attach it.
    pub upload_id: String,
    /// Its file name.
    pub name: String,
    /// Its size.
    pub bytes: usize,
    /// The passages it was cut into.
    pub chunks: usize,
}

/// A document attached to a conversation, as its listing shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttachedDocument {
    /// The upload it came from.
    pub upload_id: String,
    /// Its title (its file name, unless it names itself).
    pub title: String,
    /// The passages it was cut into.
    pub passages: usize,
}

/// `GET /api/chatbot/conversations/{id}/documents`: the documents attached to a conversation.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DocumentList {
    /// The conversation.
    #[schema(value_type = i64)]
    pub conversation_id: toolgraph_protocol::ConversationId,
    /// Its documents, as attached.
    pub documents: Vec<AttachedDocument>,
}

impl ChatService {
    fn attachments(&self) -> Result<&Attachments, ChatError> {
        self.0.options.attachments.as_ref().ok_or_else(|| {
            ChatError::Unsupported("this service keeps no attached documents (its store is the backend's)".into())
        })
    }

    /// Keeps document `name` for `who` to attach to a turn, once it is a type the service
    /// reads, no larger than [`MAX_UPLOAD_BYTES`], and readable.
    ///
    /// # Errors
    /// `Invalid` for a bad name or a document that cannot be read, `TooLarge`,
    /// `UnsupportedType`; `Store`.
    pub async fn upload(&self, who: &Principal, name: &str, bytes: Vec<u8>) -> Result<UploadReceipt, ChatError> {
        self.attachments()?;
        let name = name.trim();
        if name.is_empty()
            || name.chars().count() > 200
            || name.starts_with('.')
            || name.chars().any(|c| c.is_control() || matches!(c, '/' | '\\'))
        {
            return Err(ChatError::Invalid {
                field: "name".into(),
                message: "a file name of 1 to 200 characters, without a path, is required".into(),
            });
        }
        let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
        if !TYPES.contains(&ext.as_str()) {
            return Err(ChatError::UnsupportedType(format!(
                "cannot attach `{name}`: documents may be md, txt, html, pdf or json"
            )));
        }
        if bytes.len() > MAX_UPLOAD_BYTES {
            return Err(ChatError::TooLarge(format!(
                "`{name}` is {} bytes; a document may have at most {MAX_UPLOAD_BYTES}",
                bytes.len()
            )));
        }
        let document = NamedBytes { source: None, name: name.to_owned(), bytes };
        // A run slot of the tenant, and one of the few parses at a time: parsing a PDF is CPU
        // work, done off the async workers.
        let _slot = self.admit(who.ids().0)?;
        let _parse =
            self.0.parsing.acquire().await.map_err(|_| ChatError::Internal("the service is shutting down".into()))?;
        let (document, checked) = tokio::task::spawn_blocking(move || {
            let checked = toolgraph_rag::check_named(&document);
            (document, checked)
        })
        .await
        .map_err(|e| ChatError::Internal(format!("the upload's check stopped: {e}")))?;
        let chunks = checked.map_err(|reason| ChatError::Invalid {
            field: "file".into(),
            message: format!("cannot read `{name}`: {reason}"),
        })?;
        let (tenant, user) = who.ids();
        let id = uuid::Uuid::now_v7().to_string();
        let now = toolgraph_conversations::now_ms();
        self.0.store.put_upload(tenant, user, &id, &document.name, &document.bytes, now).await?;
        if let Err(e) = self.0.store.prune_uploads(now - UPLOAD_KEPT_MS).await {
            tracing::warn!(error = %e, "cannot delete the uploads no turn attached");
        }
        Ok(UploadReceipt { upload_id: id, name: document.name, bytes: document.bytes.len(), chunks })
    }

    /// `who`'s uploads `ids`, every one of them, or the refusal that names the first missing.
    ///
    /// # Errors
    /// `Invalid` (`attachments`) for too many, or one that is not `who`'s upload (another's,
    /// already attached, or a day old); `Store`.
    pub(super) async fn uploads_to_attach(&self, who: &Principal, ids: &[String]) -> Result<Vec<Upload>, ChatError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.attachments()?;
        if ids.len() > MAX_ATTACHED_PER_TURN {
            return Err(ChatError::Invalid {
                field: "attachments".into(),
                message: format!("a turn may attach at most {MAX_ATTACHED_PER_TURN} documents"),
            });
        }
        let (tenant, user) = who.ids();
        let since = toolgraph_conversations::now_ms() - UPLOAD_KEPT_MS;
        let found = self.0.store.uploads(tenant, user, ids, since).await?;
        if let Some(missing) = ids.iter().find(|id| !found.iter().any(|u| &u.id == *id)) {
            return Err(ChatError::Invalid {
                field: "attachments".into(),
                message: format!(
                    "no upload `{missing}` of yours to attach (an upload is attached once, and kept a day)"
                ),
            });
        }
        Ok(found)
    }

    /// Ingests `uploads` into `who`'s conversation's attachments, renewing the turn's `claim`
    /// on the conversation meanwhile. A new conversation's stale knowledge base (its id used
    /// before, by a store since re-created) is dropped first; a conversation deleted meanwhile
    /// loses what was written.
    ///
    /// # Errors
    /// `Invalid` (`attachments`) for a document that cannot be read; `Internal` when they
    /// cannot be ingested, or the claim was lost. The uploads stay either way (the caller
    /// deletes them once the turn runs), so the same turn may be asked again.
    pub(super) async fn attach(
        &self,
        who: &Principal,
        conversation: i64,
        is_new: bool,
        claim: &TurnClaim,
        uploads: Vec<Upload>,
    ) -> Result<(), ChatError> {
        if uploads.is_empty() {
            return Ok(());
        }
        let a = self.attachments()?.clone();
        let (tenant_id, user) = who.ids();
        let (tenant, kb) = (attached::tenant_of(tenant_id), attached::kb_of(conversation));
        let documents: Vec<NamedBytes> =
            uploads.into_iter().map(|u| NamedBytes { source: Some(u.id), name: u.name, bytes: u.bytes }).collect();
        // Embedding and writing the index block: off the async workers.
        let ingest = {
            let (a, tenant, kb) = (a.clone(), tenant.clone(), kb.clone());
            tokio::task::spawn_blocking(move || {
                if is_new {
                    a.store.delete(&tenant, &kb)?;
                }
                let options = IngestOptions { embedder: a.retriever.embedder()?, ..IngestOptions::default() };
                let report = toolgraph_rag::ingest_bytes(&a.store, &tenant, &kb, &documents, &options);
                a.store.evict(&tenant, &kb);
                report
            })
        };
        let report = self.renewing(conversation, claim, ingest).await?;
        let report = report
            .map_err(|e| ChatError::Internal(format!("attaching stopped: {e}")))?
            .map_err(|e| ChatError::Internal(format!("cannot attach the documents: {e}")))?;
        if self.0.store.conversation(tenant_id, user, conversation).await?.is_none() {
            self.delete_attachments(tenant_id, vec![conversation]).await?;
            return Err(ChatError::NotFound);
        }
        if let Some(skipped) = report.skipped.first() {
            return Err(ChatError::Invalid {
                field: "attachments".into(),
                message: format!("cannot read `{}`: {}", skipped.path, skipped.reason),
            });
        }
        Ok(())
    }

    /// Awaits `work` while renewing `claim` on `conversation` as a running turn does, so a
    /// long ingest does not let another run take the conversation.
    ///
    /// # Errors
    /// `Internal` when the claim was lost (another run took the conversation).
    async fn renewing<T>(
        &self,
        conversation: i64,
        claim: &TurnClaim,
        work: tokio::task::JoinHandle<T>,
    ) -> Result<Result<T, tokio::task::JoinError>, ChatError> {
        let mut renewal = super::turn::renewals(claim);
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return Ok(done),
                _ = renewal.tick() => {
                    if let Ok(false) = self.0.store.renew_turn(conversation, claim).await {
                        return Err(ChatError::Internal("the conversation was taken over while attaching".into()));
                    }
                }
            }
        }
    }

    /// The documents attached to `who`'s conversation `id`: each with its upload id (what
    /// replaced it if attached again), title and passages.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Unsupported` without attachments; `Internal` when
    /// the knowledge base cannot be read.
    pub async fn attached_documents(&self, who: &Principal, id: i64) -> Result<Vec<AttachedDocument>, ChatError> {
        let (tenant, user) = who.ids();
        // Whose it is first: another person's conversation is not there, whatever is served.
        self.0.store.conversation(tenant, user, id).await?.ok_or(ChatError::NotFound)?;
        let a = self.attachments()?.clone();
        let (tenant, kb) = (attached::tenant_of(tenant), attached::kb_of(id));
        tokio::task::spawn_blocking(move || {
            let found = match a.store.open(&tenant, &kb) {
                Ok(base) => base.documents(),
                Err(toolgraph_rag::RagError::UnknownKb { .. }) => Ok(Vec::new()),
                Err(e) => Err(e),
            };
            a.store.evict(&tenant, &kb);
            found
        })
        .await
        .map_err(|e| ChatError::Internal(e.to_string()))?
        .map(|docs| {
            docs.into_iter()
                .map(|d| AttachedDocument { upload_id: d.doc_id, title: d.title, passages: d.chunks })
                .collect()
        })
        .map_err(|e| ChatError::Internal(format!("cannot list attached documents: {e}")))
    }

    /// Deletes a conversation this turn made and could not start (with what was attached).
    pub(super) async fn forget_new_conversation(&self, tenant: i64, user: i64, conversation: i64) {
        if let Err(e) = self.0.store.delete_conversation(tenant, user, conversation).await {
            tracing::warn!(conversation, error = %e, "cannot delete the conversation the refused turn made");
        }
        if let Err(e) = self.delete_attachments(tenant, vec![conversation]).await {
            tracing::warn!(conversation, error = %e, "cannot delete what the refused turn attached");
        }
    }

    /// Deletes the attachments of `tenant`'s `conversations`.
    ///
    /// # Errors
    /// `Internal` when a knowledge base cannot be deleted.
    pub(super) async fn delete_attachments(&self, tenant: i64, conversations: Vec<i64>) -> Result<(), ChatError> {
        let Some(a) = self.0.options.attachments.clone() else { return Ok(()) };
        tokio::task::spawn_blocking(move || {
            let tenant = attached::tenant_of(tenant);
            for c in conversations {
                a.store.delete(&tenant, &attached::kb_of(c)).map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        })
        .await
        .map_err(|e| ChatError::Internal(e.to_string()))?
        .map_err(|e| ChatError::Internal(format!("cannot delete attached documents: {e}")))
    }

    /// Deletes the attachments of every conversation of `tenant`.
    ///
    /// # Errors
    /// As [`delete_attachments`](Self::delete_attachments).
    pub(super) async fn delete_tenant_attachments(&self, tenant: i64) -> Result<(), ChatError> {
        let Some(a) = self.0.options.attachments.clone() else { return Ok(()) };
        let kbs = {
            let (a, t) = (a.clone(), attached::tenant_of(tenant));
            tokio::task::spawn_blocking(move || a.store.list(&t))
                .await
                .map_err(|e| ChatError::Internal(e.to_string()))?
                .map_err(|e| ChatError::Internal(format!("cannot list attached documents: {e}")))?
        };
        let conversations: Vec<i64> = kbs.iter().filter_map(|k| k.strip_prefix('c')?.parse().ok()).collect();
        self.delete_attachments(tenant, conversations).await
    }
}
