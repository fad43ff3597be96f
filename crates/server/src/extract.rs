//! Request parsing with errors that name the offending field.

use crate::error::ApiError;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::error::Category;

/// Parses a JSON body: malformed JSON is 400, a missing or mistyped field is 422 naming it.
pub fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let text = inner.to_string();
        let text = text.split(" at line ").next().unwrap_or(&text).to_owned();
        match inner.classify() {
            Category::Data => {
                // A missing field is reported at the parent path with the name in the text.
                let field = if path == "." { text.split('`').nth(1).unwrap_or("body").to_owned() } else { path };
                ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, field, text)
            }
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::new(StatusCode::BAD_REQUEST, format!("malformed JSON: {text}"))
            }
        }
    })
}

/// `X-Tenant-Slug` must equal the body's `tenantSlug` (docs/service.md: else 400).
pub fn check_tenant_header(headers: &HeaderMap, tenant_slug: &str) -> Result<(), ApiError> {
    let header = headers.get("x-tenant-slug").and_then(|v| v.to_str().ok());
    if header != Some(tenant_slug) {
        return Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "X-Tenant-Slug",
            "the X-Tenant-Slug header must equal tenantSlug",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::StreamRequest;

    #[test]
    fn errors_name_the_field() {
        let e =
            json_body::<StreamRequest>(br#"{"tenantSlug":"a","tenantId":"x","userId":1,"message":"m"}"#).unwrap_err();
        assert_eq!((e.status.as_u16(), e.field.as_deref()), (422, Some("tenantId")));
        let e = json_body::<StreamRequest>(br#"{"tenantSlug":"a","tenantId":1,"userId":1}"#).unwrap_err();
        assert_eq!((e.status.as_u16(), e.field.as_deref()), (422, Some("message")));
        let e = json_body::<StreamRequest>(br#"{"tenantSlug":"a", "#).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.starts_with("malformed JSON"), "{}", e.message);
    }
}

/// Hostile request bodies: any bytes, and any JSON with the contract's field names at any type,
/// give a 400 or a 422 naming a field — never a panic, never a 5xx — and what passes parsing
/// is judged by `validate`, which never panics either.
#[cfg(test)]
mod body_props {
    use super::*;
    use crate::wire::{ConfirmRequest, StreamRequest};
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,40}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    const FIELDS: [&str; 10] = [
        "tenantSlug",
        "tenantId",
        "userId",
        "conversationId",
        "message",
        "agent",
        "agentId",
        "context",
        "toolEvents",
        "messageId",
    ];

    /// An object over the contract's names (some missing, some of the wrong type) plus noise.
    fn body() -> impl Strategy<Value = Value> {
        (prop::collection::btree_map(prop::sample::select(&FIELDS[..]), json(), 0..10), json()).prop_map(
            |(fields, noise)| {
                let mut m: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                m.insert("noise".into(), noise);
                Value::Object(m)
            },
        )
    }

    fn judged(result: Result<(), ApiError>) {
        if let Err(e) = result {
            assert!(matches!(e.status.as_u16(), 400 | 413 | 422), "{} {}", e.status, e.message);
            assert!(!e.message.is_empty());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            judged(json_body::<StreamRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
            judged(json_body::<ConfirmRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
        }

        #[test]
        fn any_json_with_the_contracts_names(v in body()) {
            let bytes = serde_json::to_vec(&v).unwrap_or_default();
            judged(json_body::<StreamRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
            judged(json_body::<ConfirmRequest>(&bytes).and_then(|r| r.validate().map_err(ApiError::from)));
        }
    }
}
