//! [`Secret`]: a configuration string that never prints.

use serde::{Deserialize, Serialize, Serializer};

/// A secret value (API key, database URL with password). `Debug` and `Serialize` mask it;
/// only [`Secret::expose`] gives the value.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The real value; call it only where the value is used.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A URL secret as an error may name it: scheme, user, host, port and path, the password
    /// (and any query, which may carry one) masked; a value that is no URL is masked whole.
    pub fn redacted_url(&self) -> String {
        match url::Url::parse(&self.0) {
            Ok(mut u) if u.has_host() => {
                if u.password().is_some() {
                    let _ = u.set_password(Some("********"));
                }
                if u.query().is_some() {
                    u.set_query(Some("********"));
                }
                u.to_string()
            }
            _ => "********".into(),
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(********)")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { "********" })
    }
}

#[cfg(test)]
mod url_tests {
    use super::Secret;

    #[test]
    fn a_redacted_url_names_the_server_but_not_the_password() {
        let s = Secret::new("postgres://app:pw-1234@db.internal:5433/toolgraph?sslpassword=x");
        assert_eq!(s.redacted_url(), "postgres://app:********@db.internal:5433/toolgraph?********");
        assert_eq!(Secret::new("postgres://db/x").redacted_url(), "postgres://db/x");
        assert_eq!(Secret::new("not a url pw-1234").redacted_url(), "********");
    }
}
