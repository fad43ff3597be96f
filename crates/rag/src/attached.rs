//! Documents attached to a conversation (docs/service.md, "Documents in the conversation"):
//! each conversation's own knowledge base, in a store of their own (never one a tenant's
//! searches, `/search` or MCP list), named from the numeric ids every deletion path knows.

/// The attachment store's tenant of numeric tenant `tenant_id`.
pub fn tenant_of(tenant_id: i64) -> String {
    format!("t{tenant_id}")
}

/// The knowledge base of conversation `conversation`'s attachments.
pub fn kb_of(conversation: i64) -> String {
    format!("c{conversation}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_valid_knowledge_base_names() {
        for name in [tenant_of(7), kb_of(10), tenant_of(i64::MAX), kb_of(-1)] {
            crate::index::validate_name("knowledge base", &name).unwrap();
        }
        assert_eq!((tenant_of(7), kb_of(10)), ("t7".to_owned(), "c10".to_owned()));
    }
}
