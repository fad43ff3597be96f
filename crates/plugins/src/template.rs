//! Values a manifest fills at call time: `${NAME}` from toolgraph's environment (a variable the
//! manifest lists in `env`, so secrets stay out of manifests) and `{ctx.KEY}` from the turn's
//! context (`tenant`, `userId`, …, so a server can tell whom it acts for). Other braces are
//! literal.

use serde_json::Value;
use toolgraph_tools::ToolContext;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part<'a> {
    Text(&'a str),
    Env(&'a str),
    Context(&'a str),
}

/// The pieces of `template`, in order.
fn parts(template: &str) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        let env = rest.find("${");
        let ctx = rest.find("{ctx.");
        let (at, open, is_env) = match (env, ctx) {
            (Some(e), Some(c)) if e < c => (e, 2, true),
            (_, Some(c)) => (c, 5, false),
            (Some(e), None) => (e, 2, true),
            (None, None) => break,
        };
        let Some(len) = rest[at + open..].find('}') else { break };
        if at > 0 {
            out.push(Part::Text(&rest[..at]));
        }
        let name = &rest[at + open..at + open + len];
        out.push(if is_env { Part::Env(name) } else { Part::Context(name) });
        rest = &rest[at + open + len + 1..];
    }
    if !rest.is_empty() {
        out.push(Part::Text(rest));
    }
    out
}

/// The `${NAME}` environment variables `template` reads.
pub(crate) fn env_references(template: &str) -> impl Iterator<Item = &str> {
    parts(template).into_iter().filter_map(|p| if let Part::Env(n) = p { Some(n) } else { None })
}

/// The `{ctx.KEY}` context keys `template` reads.
pub(crate) fn context_references(template: &str) -> impl Iterator<Item = &str> {
    parts(template).into_iter().filter_map(|p| if let Part::Context(n) = p { Some(n) } else { None })
}

/// `template` with its references filled from the environment now and from `ctx`.
///
/// # Errors
/// The context key `ctx` lacks (a string or a number is needed).
pub(crate) fn fill(template: &str, ctx: &ToolContext) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    for part in parts(template) {
        match part {
            Part::Text(t) => out.push_str(t),
            Part::Env(name) => out.push_str(&std::env::var(name).unwrap_or_default()),
            Part::Context(key) => match ctx.get(key) {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Number(n)) => out.push_str(&n.to_string()),
                _ => return Err(key.to_owned()),
            },
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fills_environment_and_context_and_leaves_other_braces() {
        let home = std::env::var("HOME").unwrap_or_default();
        let ctx = ToolContext::default().set("tenant", json!("acme")).set("userId", json!(7));
        assert_eq!(fill("Bearer ${HOME}", &ctx).unwrap(), format!("Bearer {home}"));
        assert_eq!(fill("{ctx.tenant}/{ctx.userId}", &ctx).unwrap(), "acme/7");
        assert_eq!(fill("{json} {ctx.tenant", &ctx).unwrap(), "{json} {ctx.tenant", "unclosed stays literal");
        assert_eq!(fill("user {ctx.email}", &ctx), Err("email".to_string()));
        assert_eq!(env_references("a ${X} {ctx.y} ${Z}").collect::<Vec<_>>(), ["X", "Z"]);
        assert_eq!(context_references("a ${X} {ctx.y} ${Z}").collect::<Vec<_>>(), ["y"]);
    }
}
