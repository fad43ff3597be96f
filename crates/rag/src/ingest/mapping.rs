//! Applying a [`RecordMapping`] to JSON records: each record (or each item of its nested
//! `records` arrays) becomes a [`SourceDocument`], its templates rendered against the record and
//! the records around it. The mapping's declaration and template syntax live with the manifest
//! that records them (`index::mapping`).

use crate::index::RecordMapping;
use crate::index::mapping::{Compiled, Part, Template};
use crate::ingest::SourceDocument;
use serde_json::{Map, Value};

impl RecordMapping {
    /// Maps records (each with a label for error messages: "record 3", "line 7").
    ///
    /// # Errors
    /// A record without an id, or a `records` path that is not an array.
    pub fn apply<'a>(
        &self,
        records: impl IntoIterator<Item = (String, &'a Value)>,
    ) -> Result<Vec<SourceDocument>, String> {
        let compiled = self.compile()?;
        let mut out = Vec::new();
        for (where_, record) in records {
            let mut stack = vec![record];
            compiled.descend(&where_, &compiled.levels, &mut stack, &mut out)?;
        }
        Ok(out)
    }
}

impl Compiled<'_> {
    fn descend(
        &self,
        where_: &str,
        levels: &[&str],
        stack: &mut Vec<&Value>,
        out: &mut Vec<SourceDocument>,
    ) -> Result<(), String> {
        let Some((level, rest)) = levels.split_first() else {
            out.push(self.map_one(where_, stack)?);
            return Ok(());
        };
        // The stack is never empty: `apply` seeds it and only this function pushes and pops.
        let current = stack[stack.len() - 1];
        let items = match lookup(current, level) {
            Some(Value::Array(items)) => items,
            Some(Value::Null) | None => return Ok(()),
            Some(_) => return Err(format!("{where_}: `{level}` is not an array")),
        };
        for (i, item) in items.iter().enumerate() {
            stack.push(item);
            self.descend(&format!("{where_}, {level}[{i}]"), rest, stack, out)?;
            stack.pop();
        }
        Ok(())
    }

    fn map_one(&self, where_: &str, stack: &[&Value]) -> Result<SourceDocument, String> {
        let record = stack[stack.len() - 1];
        let ctx = Ctx { stack, first_line: None };
        let text = match &self.text {
            Some(t) => t.render(&ctx).unwrap_or_default(),
            None => {
                ["text", "content", "body"].iter().find_map(|k| lookup(record, k).map(scalar_text)).unwrap_or_default()
            }
        };
        let first_line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("").to_owned();
        let ctx = Ctx { stack, first_line: Some(&first_line) };
        let id = match &self.id {
            Some(t) => t.render(&ctx),
            None => ["_id", "id"].iter().find_map(|k| lookup(record, k).map(scalar_text)),
        }
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{where_}: no id (map one with `id`)"))?;
        let title = match &self.title {
            Some(t) => t.render(&ctx).unwrap_or_default(),
            None => lookup(record, "title").map(scalar_text).unwrap_or_default(),
        };
        let mut meta = Map::new();
        if self.meta.is_empty() {
            if let Some(Value::Object(m)) = lookup(record, "metadata") {
                meta.extend(m.clone());
            }
            if let Value::Object(fields) = record {
                for (k, v) in fields {
                    let skip = matches!(k.as_str(), "_id" | "id" | "title" | "text" | "content" | "body" | "metadata");
                    if !skip && is_metadata_value(v) {
                        meta.insert(k.clone(), v.clone());
                    }
                }
            }
        } else {
            for (name, t) in &self.meta {
                if let Some(v) = t.render_value(&ctx) {
                    meta.insert((*name).to_owned(), v);
                }
            }
        }
        let mut doc = SourceDocument::plain(id, title, text);
        doc.meta = meta;
        doc.citation = self.citation.as_ref().and_then(|t| t.render(&ctx));
        Ok(doc)
    }
}

fn is_metadata_value(v: &Value) -> bool {
    match v {
        Value::String(_) | Value::Number(_) | Value::Bool(_) => true,
        Value::Array(items) => items.iter().all(|i| matches!(i, Value::String(_) | Value::Number(_) | Value::Bool(_))),
        _ => false,
    }
}

fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

struct Ctx<'a> {
    stack: &'a [&'a Value],
    first_line: Option<&'a str>,
}

impl Template<'_> {
    fn field<'v>(ctx: &Ctx<'v>, up: usize, path: &str) -> Option<&'v Value> {
        let idx = ctx.stack.len().checked_sub(1 + up)?;
        lookup(ctx.stack[idx], path)
    }

    /// The text, or `None` when a referenced field is missing.
    fn render(&self, ctx: &Ctx<'_>) -> Option<String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Literal(l) => out.push_str(l),
                Part::Field { up, path } => out.push_str(&scalar_text(Self::field(ctx, *up, path)?)),
                Part::FirstLine => out.push_str(ctx.first_line?),
            }
        }
        Some(out)
    }

    fn render_value(&self, ctx: &Ctx<'_>) -> Option<Value> {
        if let [Part::Field { up, path }] = self.parts.as_slice() {
            return Self::field(ctx, *up, path).filter(|v| !v.is_null()).cloned();
        }
        self.render(ctx).map(Value::String)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_mapping_reads_beir_records() {
        let r = json!({"_id": "4983", "title": "T", "text": "Body", "metadata": {"year": 2001}, "lang": "en", "nested": {"x": 1}});
        let docs = RecordMapping::default().apply([("record 1".into(), &r)]).unwrap();
        assert_eq!((docs[0].id.as_str(), docs[0].title.as_str(), docs[0].full_text().as_str()), ("4983", "T", "Body"));
        assert_eq!(docs[0].meta["year"], 2001);
        assert_eq!(docs[0].meta["lang"], "en");
        assert!(!docs[0].meta.contains_key("nested"));
    }

    #[test]
    fn nested_records_reach_their_parents() {
        let m = RecordMapping::from_toml(
            "records = \"articles\"\nid = \"{^id}#{id}\"\ntitle = \"{$first_line}\"\ncitation = \"Điều {id}, {^id}\"\n[meta]\nlaw = \"{^id}\"\narticle_number = \"{id}\"\nn = \"{n}\"\n",
        )
        .unwrap();
        let law = json!([{"id": "Luật Điện ảnh", "articles": [{"id": "45", "n": 45, "text": "Trách nhiệm\n\nChính phủ ... Điều 5 ..."}]}]);
        let Value::Array(items) = &law else { unreachable!() };
        let docs = m.apply(items.iter().map(|r| ("record 1".to_owned(), r))).unwrap();
        assert_eq!(docs.len(), 1);
        let d = &docs[0];
        assert_eq!(d.id, "Luật Điện ảnh#45");
        assert_eq!(d.title, "Trách nhiệm");
        assert_eq!(d.citation.as_deref(), Some("Điều 45, Luật Điện ảnh"));
        assert_eq!(d.meta["law"], "Luật Điện ảnh");
        assert_eq!(d.meta["article_number"], "45");
        assert_eq!(d.meta["n"], 45, "a single-placeholder template keeps the number");
    }

    #[test]
    fn bad_mappings_and_records_are_named() {
        assert!(RecordMapping::from_toml("recrods = \"x\"").unwrap_err().contains("unknown field"));
        assert!(RecordMapping::from_toml("id = \"{oops\"").unwrap_err().contains("without"));
        let mut m = RecordMapping::default();
        assert!(m.set("colour=red").unwrap_err().contains("unknown key"));
        m.set("records=items").unwrap();
        let r = json!({"items": 3});
        assert!(m.apply([("record 1".into(), &r)]).unwrap_err().contains("not an array"));
        let r = json!({"text": "no id here"});
        assert!(RecordMapping::default().apply([("line 4".into(), &r)]).unwrap_err().contains("line 4: no id"));
    }
}
