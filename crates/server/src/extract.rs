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
