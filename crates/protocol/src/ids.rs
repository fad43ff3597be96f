//! Ids as types: the tenant, person, conversation and message of the chat contract, and a
//! run, each its own type so that one cannot be passed where another is meant (a user id for
//! a tenant id type-checks as `i64`; as [`UserId`] and [`TenantId`] it does not).
//!
//! On the wire each is exactly what it was: the bare number (or, for a run, the string); serde
//! reads and writes them transparently, so `{"tenantId": 7}` is a `TenantId(7)`.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! numeric_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$name> for i64 {
            fn from(id: $name) -> i64 {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::num::ParseIntError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse().map(Self)
            }
        }
    };
}

numeric_id!(
    /// A tenant (an academy, a firm): everything stored is scoped by it.
    TenantId
);
numeric_id!(
    /// A person of a tenant; conversations are theirs.
    UserId
);
numeric_id!(
    /// A conversation: the messages, checkpoints and runs of one chat with one agent.
    ConversationId
);
numeric_id!(
    /// A stored message; a pending action is named by the message that holds it.
    MessageId
);

/// A run: one turn, or the resumption of a paused one. A UUID (v7) written by the service; a
/// client only ever hands one back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct RunId(pub String);

impl RunId {
    /// The id as the wire has it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for RunId {
    fn from(id: String) -> Self {
        Self(id)
    }
}

impl From<&str> for RunId {
    fn from(id: &str) -> Self {
        Self(id.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_their_bare_values_on_the_wire() {
        assert_eq!(serde_json::to_string(&TenantId(7)).unwrap(), "7");
        assert_eq!(serde_json::from_str::<ConversationId>("42").unwrap(), ConversationId(42));
        assert_eq!(serde_json::to_string(&RunId("r-1".into())).unwrap(), "\"r-1\"");
        assert!(serde_json::from_str::<UserId>("\"3\"").is_err(), "a number, not a string");
        assert_eq!("12".parse::<MessageId>().unwrap(), MessageId(12));
        assert_eq!(UserId(5).to_string(), "5");
    }
}
