//! A person's store of long-term memory (docs/memory.md), as the service serves it: every item
//! is the asking person's, under the rules of `toolgraph_conversations::items::PersonItems`
//! (checked before the store is reached; reading refreshes the time to live of what it
//! returns), and expired items are deleted in the background.

use super::ChatService;
use crate::auth::Principal;
use crate::error::ChatError;
use serde_json::{Map, Value};
use std::time::Duration;
use toolgraph_conversations::items::{IndexFields, ItemError, ItemSearch, NamespaceListing, PersonItems};
use toolgraph_conversations::{MemoryItem, now_ms};

/// How often a replica deletes expired items, at most (on a write).
const PRUNE_EVERY_MS: i64 = 60_000;

impl From<ItemError> for ChatError {
    fn from(e: ItemError) -> Self {
        match e {
            ItemError::Invalid { field, message } => ChatError::Invalid { field, message },
            ItemError::Store(e) => e.into(),
            ItemError::Stopped(e) => ChatError::Internal(format!("the item search stopped: {e}")),
        }
    }
}

impl ChatService {
    fn items_of(&self, who: &Principal) -> PersonItems<'_> {
        let (tenant, user) = who.ids();
        PersonItems::new(self.0.store.as_ref(), tenant, user).indexed(self.0.options.item_index.as_ref())
    }

    /// Writes `value` under `namespace`/`key` in `who`'s store, to expire `ttl` after its last
    /// write or refreshing read (none: never); `fields` of it are embedded when items are
    /// searched by meaning.
    ///
    /// # Errors
    /// `Invalid` for a namespace, key or value that cannot be kept (named), `Store`.
    pub async fn put_item(
        &self,
        who: &Principal,
        namespace: Vec<String>,
        key: String,
        value: Map<String, Value>,
        ttl: Option<Duration>,
        fields: &IndexFields,
    ) -> Result<MemoryItem, ChatError> {
        let item = self.items_of(who).put(namespace, key, value, ttl, fields, now_ms()).await?;
        self.prune_items(item.updated_at_ms);
        Ok(item)
    }

    /// Deletes the store's expired items in the background, at most once per
    /// [`PRUNE_EVERY_MS`] per replica (reads never see them anyway: this only frees their
    /// space). A failure is logged.
    fn prune_items(&self, now: i64) {
        use std::sync::atomic::Ordering;
        let last = self.0.items_pruned_at.load(Ordering::Relaxed);
        if now - last < PRUNE_EVERY_MS
            || self.0.items_pruned_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        let store = std::sync::Arc::clone(&self.0.store);
        self.0.tasks.spawn(async move {
            match store.prune_items(now).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(items = n, "expired memory items deleted"),
                Err(e) => tracing::warn!(error = %e, "cannot delete expired memory items"),
            }
        });
    }

    /// `who`'s unexpired item under `namespace`/`key`; `refresh` renews its time to live.
    ///
    /// # Errors
    /// `NotFound`, `Invalid` for a namespace that is none, `Store`.
    pub async fn item(
        &self,
        who: &Principal,
        namespace: &[String],
        key: &str,
        refresh: bool,
    ) -> Result<MemoryItem, ChatError> {
        self.items_of(who).get(namespace, key, refresh, now_ms()).await?.ok_or(ChatError::NotFound)
    }

    /// What `search` finds in `who`'s store, each with its score when it has a query;
    /// `refresh` renews the time to live of what it returns.
    ///
    /// # Errors
    /// `Invalid` for a prefix or filter that is none, `Store`.
    pub async fn search_items(
        &self,
        who: &Principal,
        search: &ItemSearch,
        refresh: bool,
    ) -> Result<Vec<(MemoryItem, Option<f64>)>, ChatError> {
        Ok(self.items_of(who).search(search, refresh, now_ms()).await?)
    }

    /// The namespaces of `who`'s store that `listing` shows.
    ///
    /// # Errors
    /// `Invalid` for a prefix or suffix that is none, `Store`.
    pub async fn item_namespaces(
        &self,
        who: &Principal,
        listing: &NamespaceListing,
    ) -> Result<Vec<Vec<String>>, ChatError> {
        Ok(self.items_of(who).namespaces(listing, now_ms()).await?)
    }

    /// Deletes `who`'s item under `namespace`/`key`; whether there was one.
    ///
    /// # Errors
    /// `Invalid` for a namespace that is none, `Store`.
    pub async fn delete_item(&self, who: &Principal, namespace: &[String], key: &str) -> Result<bool, ChatError> {
        Ok(self.items_of(who).delete(namespace, key).await?)
    }
}
