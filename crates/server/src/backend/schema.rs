//! Seed 002's tenant schema in the system prompt: `GET /internal/chatbot/schema?tenantId=N`
//! describes the tables the backend's `general_query` reads, so the model writes SQL against
//! the tenant's real schema. One call per tenant per [`SCHEMA_TTL`], not one per model call.

use super::client::BackendConversationStore;
use super::wire::{TenantSchema, path};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolgraph_graph::react::PromptContext;

/// How long a tenant's schema is reused before it is asked for again.
pub const SCHEMA_TTL: Duration = Duration::from_secs(300);

/// Most tenants whose schema is kept; beyond it the expired ones, then all, are dropped.
const MAX_TENANTS: usize = 1024;

type Cache = Mutex<HashMap<i64, (Instant, Arc<str>)>>;

/// The system-prompt addition of a turn: its tenant's schema description from `backend`.
/// A failing backend adds nothing (logged), so the turn still runs; a turn whose state has no
/// tenant adds nothing either.
pub fn tenant_schema_prompt(backend: BackendConversationStore) -> PromptContext {
    let cache: Arc<Cache> = Arc::default();
    Arc::new(move |context: &Map<String, Value>| {
        let (backend, cache) = (backend.clone(), Arc::clone(&cache));
        let tenant = context.get("tenantId").and_then(Value::as_i64);
        let slug = context.get("tenant").and_then(Value::as_str).map(str::to_owned);
        Box::pin(async move {
            let (tenant, slug) = (tenant?, slug?);
            if let Some(text) = cached(&cache, tenant) {
                return Some(text.to_string());
            }
            let target = format!("{}?tenantId={tenant}", path::SCHEMA);
            match backend.get_for_tenant::<TenantSchema>(&target, &slug).await {
                Ok(answer) => {
                    let text: Arc<str> = format!("Database schema of this tenant:\n{}", answer.schema).into();
                    remember(&cache, tenant, Arc::clone(&text));
                    Some(text.to_string())
                }
                Err(e) => {
                    tracing::warn!(tenant, error = %e, "cannot get the tenant schema; the turn runs without it");
                    None
                }
            }
        })
    })
}

fn cached(cache: &Cache, tenant: i64) -> Option<Arc<str>> {
    let cache = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    cache.get(&tenant).filter(|(at, _)| at.elapsed() < SCHEMA_TTL).map(|(_, text)| Arc::clone(text))
}

fn remember(cache: &Cache, tenant: i64, text: Arc<str>) {
    let mut cache = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if cache.len() >= MAX_TENANTS {
        cache.retain(|_, (at, _)| at.elapsed() < SCHEMA_TTL);
        if cache.len() >= MAX_TENANTS {
            cache.clear();
        }
    }
    cache.insert(tenant, (Instant::now(), text));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendOptions;
    use serde_json::json;

    fn context(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[tokio::test]
    async fn no_tenant_or_no_backend_adds_nothing() {
        // Nothing listens on port 9 (discard): the call fails at once.
        let options = BackendOptions {
            base_url: "http://127.0.0.1:9".into(),
            secret: b"0123456789abcdef".to_vec(),
            timeout: Duration::from_secs(2),
        };
        let prompt = tenant_schema_prompt(BackendConversationStore::new(options).unwrap());
        assert_eq!(prompt(&context(json!({"tenant": "acme"}))).await, None, "no tenantId");
        assert_eq!(prompt(&context(json!({"tenant": "acme", "tenantId": 1}))).await, None, "backend down");
    }

    #[test]
    fn the_cache_keeps_fresh_entries_and_stays_bounded() {
        let cache: Cache = Mutex::default();
        remember(&cache, 1, "a".into());
        assert_eq!(cached(&cache, 1).as_deref(), Some("a"));
        assert_eq!(cached(&cache, 2), None);
        for t in 0..(MAX_TENANTS as i64 + 10) {
            remember(&cache, t, "x".into());
        }
        assert!(cache.lock().unwrap().len() <= MAX_TENANTS);
    }
}
