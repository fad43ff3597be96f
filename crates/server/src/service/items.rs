//! A person's store of long-term memory (docs/memory.md), as the service serves it: every item
//! is the asking person's, checked before the store is reached, and reading refreshes the time
//! to live of what it returns.

use super::ChatService;
use crate::auth::Principal;
use crate::error::ChatError;
use serde_json::{Map, Value};
use std::time::Duration;
use toolgraph_conversations::MemoryItem;
use toolgraph_conversations::items::{
    ITEMS_READ, ItemSearch, NamespaceListing, check_item, check_key, check_namespace, check_search, list_namespaces,
    search_items,
};

/// How often a replica deletes expired items, at most (on a write).
const PRUNE_EVERY_MS: i64 = 60_000;

fn invalid(message: String) -> ChatError {
    // The checks name their field first: "namespace: …", "key: …", "filter: …".
    let field = message.split(':').next().unwrap_or("item").to_owned();
    ChatError::Invalid { field, message }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl ChatService {
    /// Writes `value` under `namespace`/`key` in `who`'s store, to expire `ttl` after its last
    /// write or refreshing read (none: never).
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
    ) -> Result<MemoryItem, ChatError> {
        check_item(&namespace, &key, &value).map_err(invalid)?;
        let ttl_ms = ttl.map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX));
        let item = MemoryItem::new(namespace, key, value, ttl_ms, now_ms());
        let (tenant, user) = who.ids();
        // A new key past the bound is refused (a search reads them all); a rewrite is not.
        let kept = self.0.store.count_items(tenant, user, item.updated_at_ms).await?;
        if kept >= ITEMS_READ as u64
            && self.0.store.item(tenant, user, &item.namespace, &item.key, item.updated_at_ms).await?.is_none()
        {
            return Err(ChatError::Invalid {
                field: "key".into(),
                message: format!("you keep {kept} items, the most a person's store holds: delete some first"),
            });
        }
        self.0.store.put_item(tenant, user, &item).await?;
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
        check_namespace(namespace, false).map_err(invalid)?;
        check_key(key).map_err(invalid)?;
        let (tenant, user) = who.ids();
        let now = now_ms();
        let item = self.0.store.item(tenant, user, namespace, key, now).await?.ok_or(ChatError::NotFound)?;
        if refresh && item.ttl_ms.is_some() {
            self.0.store.refresh_items(tenant, user, &[(item.namespace.clone(), item.key.clone())], now).await?;
        }
        Ok(item)
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
        check_namespace(&search.prefix, false).map_err(invalid)?;
        check_search(search).map_err(invalid)?;
        let (tenant, user) = who.ids();
        let now = now_ms();
        let candidates = self.0.store.items(tenant, user, &search.prefix, now).await?;
        // Matching reads every value under the prefix: off the async threads.
        let asked = search.clone();
        let found = tokio::task::spawn_blocking(move || search_items(candidates, &asked))
            .await
            .map_err(|e| ChatError::Internal(format!("the item search stopped: {e}")))?
            .map_err(invalid)?;
        let living: Vec<(Vec<String>, String)> = found
            .iter()
            .filter(|(i, _)| i.ttl_ms.is_some())
            .map(|(i, _)| (i.namespace.clone(), i.key.clone()))
            .collect();
        if refresh && !living.is_empty() {
            self.0.store.refresh_items(tenant, user, &living, now).await?;
        }
        Ok(found)
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
        check_namespace(&listing.prefix, true).map_err(invalid)?;
        check_namespace(&listing.suffix, true).map_err(invalid)?;
        // The literal labels before the first wildcard narrow what is read.
        let fixed: Vec<String> = listing.prefix.iter().take_while(|l| *l != "*").cloned().collect();
        let (tenant, user) = who.ids();
        let namespaces = self.0.store.item_namespaces(tenant, user, &fixed, now_ms()).await?;
        Ok(list_namespaces(&namespaces, listing))
    }

    /// Deletes `who`'s item under `namespace`/`key`; whether there was one.
    ///
    /// # Errors
    /// `Invalid` for a namespace that is none, `Store`.
    pub async fn delete_item(&self, who: &Principal, namespace: &[String], key: &str) -> Result<bool, ChatError> {
        check_namespace(namespace, false).map_err(invalid)?;
        check_key(key).map_err(invalid)?;
        let (tenant, user) = who.ids();
        Ok(self.0.store.delete_item(tenant, user, namespace, key).await?)
    }
}
