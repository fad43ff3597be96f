//! [`Filter`]: conditions on chunk metadata — equality, any-of, numeric ranges — written as
//! `key=value`, `key=a|b`, `key>=3`, `key=1..5` on the command line or as JSON in the API.
//!
//! Each filter becomes part of the index query of every list a search ranks
//! ([`Filter::index_query`]): string comparisons ignore case (`asignatura=IV` finds `iv`),
//! numbers compare as numbers, and an array in the metadata matches when any element does.

use serde_json::Value;
use std::ops::Bound;
use tantivy::Term;
use tantivy::query::{BooleanQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::{Field, IndexRecordOption};

/// A condition on one metadata key (dotted paths reach nested objects).
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// The key has this value (or, for an array, contains it).
    Eq {
        /// Metadata key.
        key: String,
        /// Value.
        value: Value,
    },
    /// The key has one of these values.
    AnyOf {
        /// Metadata key.
        key: String,
        /// Accepted values.
        values: Vec<Value>,
    },
    /// The key is a number within the bounds.
    Range {
        /// Metadata key.
        key: String,
        /// Lower bound and whether it is included.
        lower: Option<(f64, bool)>,
        /// Upper bound and whether it is included.
        upper: Option<(f64, bool)>,
    },
}

impl Filter {
    /// The metadata key.
    pub fn key(&self) -> &str {
        match self {
            Self::Eq { key, .. } | Self::AnyOf { key, .. } | Self::Range { key, .. } => key,
        }
    }

    /// Parses `k=v`, `k=a|b`, `k>=n`, `k>n`, `k<=n`, `k<n`, `k=lo..hi`.
    ///
    /// # Errors
    /// A readable reason.
    pub fn parse(expr: &str) -> Result<Self, String> {
        let ops = [">=", "<=", ">", "<", "="];
        let (pos, op) = ops
            .iter()
            .filter_map(|op| expr.find(op).map(|p| (p, *op)))
            .min_by_key(|(p, op)| (*p, std::cmp::Reverse(op.len())))
            .ok_or_else(|| format!("filter `{expr}`: expected KEY=VALUE, KEY>=N, KEY<N or KEY=LO..HI"))?;
        let key = expr[..pos].trim();
        let value = expr[pos + op.len()..].trim();
        if key.is_empty() || value.is_empty() {
            return Err(format!("filter `{expr}`: key and value must not be empty"));
        }
        let number = |s: &str| s.trim().parse::<f64>().map_err(|_| format!("filter `{expr}`: `{s}` is not a number"));
        let key = key.to_owned();
        Ok(match op {
            ">=" => Self::Range { key, lower: Some((number(value)?, true)), upper: None },
            ">" => Self::Range { key, lower: Some((number(value)?, false)), upper: None },
            "<=" => Self::Range { key, lower: None, upper: Some((number(value)?, true)) },
            "<" => Self::Range { key, lower: None, upper: Some((number(value)?, false)) },
            _ => {
                if let Some((lo, hi)) = value.split_once("..") {
                    Self::Range { key, lower: Some((number(lo)?, true)), upper: Some((number(hi)?, true)) }
                } else if value.contains('|') {
                    Self::AnyOf { key, values: value.split('|').map(|v| scalar(v.trim())).collect() }
                } else {
                    Self::Eq { key, value: scalar(value) }
                }
            }
        })
    }

    /// Parses the API's JSON form: `"v"` or a number (equality), `["a","b"]` (any of),
    /// `{"gte":1,"lt":5}` (range; `gt`, `gte`, `lt`, `lte`).
    ///
    /// # Errors
    /// A readable reason naming the key.
    pub fn from_json(key: &str, value: &Value) -> Result<Self, String> {
        let key = key.to_owned();
        match value {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => Ok(Self::Eq { key, value: value.clone() }),
            Value::Array(items) if !items.is_empty() && items.iter().all(is_scalar) => {
                Ok(Self::AnyOf { key, values: items.clone() })
            }
            Value::Object(bounds) if !bounds.is_empty() => {
                let mut lower = None;
                let mut upper = None;
                for (op, v) in bounds {
                    let n = v.as_f64().ok_or_else(|| format!("filter `{key}`: `{op}` needs a number"))?;
                    match op.as_str() {
                        "gte" => lower = Some((n, true)),
                        "gt" => lower = Some((n, false)),
                        "lte" => upper = Some((n, true)),
                        "lt" => upper = Some((n, false)),
                        _ => return Err(format!("filter `{key}`: unknown bound `{op}` (gt, gte, lt, lte)")),
                    }
                }
                Ok(Self::Range { key, lower, upper })
            }
            _ => Err(format!("filter `{key}`: expected a value, a non-empty array of values or a range object")),
        }
    }
}

fn is_scalar(v: &Value) -> bool {
    matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_))
}

/// A command-line value: a string (numbers stay strings here; the index matches both forms).
fn scalar(s: &str) -> Value {
    Value::String(s.to_owned())
}

impl Filter {
    /// This filter as a query on the knowledge base's metadata `field`, to be combined with a
    /// keyword query or to select the rows a dense search may return.
    pub(crate) fn index_query(&self, field: Field) -> Box<dyn Query> {
        let path_term = |key: &str| Term::from_field_json_path(field, key, false);
        let value_terms = |key: &str, v: &Value| -> Vec<Term> {
            let mut out = Vec::new();
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let mut t = path_term(key);
            t.append_type_and_str(&text.to_lowercase());
            out.push(t);
            // Numbers are indexed as f64; a command-line "3" must still find a JSON 3.
            if let Ok(f) = text.trim().parse::<f64>() {
                let mut t = path_term(key);
                t.append_type_and_fast_value(f);
                out.push(t);
            }
            if let Ok(b) = text.trim().parse::<bool>() {
                let mut t = path_term(key);
                t.append_type_and_fast_value(b);
                out.push(t);
            }
            out
        };
        let any = |terms: Vec<Term>| -> Box<dyn Query> {
            Box::new(BooleanQuery::new(
                terms
                    .into_iter()
                    .map(|t| (Occur::Should, Box::new(TermQuery::new(t, IndexRecordOption::Basic)) as Box<dyn Query>))
                    .collect(),
            ))
        };
        match self {
            Filter::Eq { key, value } => any(value_terms(key, value)),
            Filter::AnyOf { key, values } => any(values.iter().flat_map(|v| value_terms(key, v)).collect()),
            Filter::Range { key, lower, upper } => {
                let bound = |b: Option<(f64, bool)>| match b {
                    None => Bound::Unbounded,
                    Some((v, inc)) => {
                        let mut t = path_term(key);
                        t.append_type_and_fast_value(v);
                        if inc { Bound::Included(t) } else { Bound::Excluded(t) }
                    }
                };
                Box::new(RangeQuery::new(bound(*lower), bound(*upper)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            Filter::parse("asignatura=iv").unwrap(),
            Filter::Eq { key: "asignatura".into(), value: json!("iv") }
        );
        assert_eq!(
            Filter::parse("tipo=guia|apuntes").unwrap(),
            Filter::AnyOf { key: "tipo".into(), values: vec![json!("guia"), json!("apuntes")] }
        );
        assert_eq!(
            Filter::parse("year>=2020").unwrap(),
            Filter::Range { key: "year".into(), lower: Some((2020.0, true)), upper: None }
        );
        assert_eq!(
            Filter::parse("page=2..4").unwrap(),
            Filter::Range { key: "page".into(), lower: Some((2.0, true)), upper: Some((4.0, true)) }
        );
        assert!(Filter::parse("nothing").unwrap_err().contains("expected KEY=VALUE"));
        assert!(Filter::parse("year>=soon").unwrap_err().contains("not a number"));
        assert!(Filter::parse("=x").is_err());
        assert!(Filter::from_json("y", &json!({"over": 3})).unwrap_err().contains("unknown bound"));
        assert!(Filter::from_json("y", &json!([])).is_err());
        assert!(Filter::from_json("y", &json!(null)).is_err());
    }
}
