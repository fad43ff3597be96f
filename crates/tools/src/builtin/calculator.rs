//! `calculator`: exact-enough arithmetic for a model that is bad at it.
//!
//! A small recursive-descent evaluator over `f64` (`+ - * / % ^`, parentheses, unary minus,
//! constants `pi` and `e`, and a few functions). Hand-written on purpose: general expression
//! crates evaluate `7/2` as integer division or accept assignments and strings, neither of
//! which a calculator should.

use crate::{Tool, ToolBuilder, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// Arguments of `calculator`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CalculatorArgs {
    /// The arithmetic expression to evaluate, written with the numbers of the request. Operators: + - * / % ^;
    /// functions: sqrt, abs, ln, log10, exp, sin, cos, tan, round, floor, ceil, min, max;
    /// constants: pi, e.
    #[schemars(length(min = 1, max = 500))]
    pub expression: String,
    /// Round the result to this many decimal places.
    #[schemars(range(min = 0, max = 15))]
    pub decimals: Option<u8>,
}

/// The `calculator` read tool.
pub fn calculator() -> Arc<dyn Tool> {
    ToolBuilder::<CalculatorArgs>::new(
        "calculator",
        "Evaluate an arithmetic expression exactly. Use it for any computation instead of doing arithmetic yourself.",
    )
    .display_name("Calculator")
    .display_description("Evaluates arithmetic expressions")
    .param_display("expression", "Expression")
    .param_display("decimals", "Decimal places")
    .handler(|_ctx, args: CalculatorArgs| async move {
        let mut value = evaluate(&args.expression).map_err(ToolError::invalid_arguments)?;
        if let Some(d) = args.decimals {
            let f = 10f64.powi(i32::from(d));
            value = (value * f).round() / f;
        }
        Ok(json!({ "expression": args.expression, "result": value }))
    })
    .expect("the calculator's schema is static and valid") // invariant: covered by tests
}

/// Evaluates `expr`; the error says where and why it cannot. A comma between a digit and one
/// or two digits, in an expression with no function to separate arguments of, is a decimal
/// comma ("0,4 * 6,5", as a Spanish request writes it and a model copies it); "1,000" stays
/// an error rather than a guess.
///
/// # Errors
/// A syntax error, an unknown name, division by zero, or a non-finite result.
pub fn evaluate(expr: &str) -> Result<f64, String> {
    match evaluate_as_written(expr) {
        Err(e) if expr.contains(',') && !expr.chars().any(char::is_alphabetic) => {
            evaluate_as_written(&decimal_points(expr)).map_err(|_| e)
        }
        value => value,
    }
}

/// `expr` with each decimal comma (a digit, the comma, then one or two digits and no third) as
/// a point.
fn decimal_points(expr: &str) -> String {
    let b = expr.as_bytes();
    let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    expr.char_indices()
        .map(|(i, c)| {
            let decimal = c == ',' && i > 0 && digit(i - 1) && digit(i + 1) && !(digit(i + 2) && digit(i + 3));
            if decimal { '.' } else { c }
        })
        .collect()
}

/// [`evaluate`] of `expr` exactly as written.
fn evaluate_as_written(expr: &str) -> Result<f64, String> {
    let mut p = Parser { src: expr.as_bytes(), pos: 0, depth: 0 };
    let v = p.expr()?;
    p.skip_ws();
    if p.pos < p.src.len() {
        return Err(format!("unexpected '{}' at position {}", p.src[p.pos] as char, p.pos + 1));
    }
    if !v.is_finite() {
        return Err("the result is not a finite number".into());
    }
    Ok(v)
}

/// Longest expression [`expression_in`] reads (the calculator's own argument limit).
const MAX_EXPRESSION_CHARS: usize = 500;

/// The arithmetic a person wrote out in `text` ("Calcula mi nota: 0.6 * 8 + 0.4 * 6.5"), ready
/// for [`evaluate`]: the longest stretch of at least two numbers joined by operators that it
/// accepts, with `×`/`÷` read as `*`/`/` and a decimal comma as a point. It must
/// join two numbers by `+`, `*`, `^` or `÷`: `-` and `/` alone write dates, ranges, scores and
/// codes far more often than sums ("20/01/2026", "temas 3 - 5", "8 / 10", "2025-2026"), and a
/// time or a phone number ("10:30 - 12:00", "+34-600-000-000") is not one. `None`: no
/// computation in the text.
pub fn expression_in(text: &str) -> Option<String> {
    let mut best: Option<String> = None;
    let mut span = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let between_digits =
            |i: usize| i > 0 && chars[i - 1].is_ascii_digit() && chars.get(i + 1).is_some_and(char::is_ascii_digit);
        let kept = match c {
            '0'..='9' | '.' | '(' | ')' | '+' | '-' | '*' | '/' | '^' | ' ' | '\t' => Some(c),
            '×' => Some('*'),
            // Kept apart from `/`: it asks for a division as plainly as `*` a product.
            '÷' => Some('÷'),
            ',' if between_digits(i) => Some(','),
            // A time's colon stays in: the stretch no longer evaluates ("10:30 - 12:00").
            ':' if between_digits(i) => Some(':'),
            _ => None,
        };
        match kept {
            Some(c) => span.push(c),
            None => take_expression(&mut span, &mut best),
        }
    }
    take_expression(&mut span, &mut best);
    best
}

/// Ends a stretch of [`expression_in`]: `best` becomes it when it is arithmetic and longer.
fn take_expression(span: &mut String, best: &mut Option<String>) {
    let mut expr = span.trim().trim_end_matches(['.', ' ']);
    // A parenthesis the surrounding words opened or closed ("(nota: 0.6 * 8 + 1)").
    loop {
        let (open, close) = (expr.matches('(').count(), expr.matches(')').count());
        if let Some(rest) = expr.strip_prefix('(').filter(|_| open > close) {
            expr = rest.trim_start();
        } else if let Some(rest) = expr.strip_suffix(')').filter(|_| close > open) {
            expr = rest.trim_end();
        } else {
            break;
        }
    }
    let numbers = expr
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|n| n.chars().any(|c| c.is_ascii_digit()))
        .count();
    // An operator joins numbers only after one: a leading `+` or `-` is a sign.
    let operator = expr.char_indices().any(|(i, c)| i > 0 && matches!(c, '+' | '*' | '^' | '÷'));
    let expr = decimal_points(&expr.replace('÷', "/"));
    if numbers >= 2
        && operator
        && expr.len() <= MAX_EXPRESSION_CHARS
        && best.as_ref().is_none_or(|b| expr.len() > b.len())
        && evaluate(&expr).is_ok()
    {
        *best = Some(expr);
    }
    span.clear();
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    depth: u32,
}

/// Nesting limit: bounds recursion on hostile input like 10,000 opening parentheses.
const MAX_DEPTH: u32 = 64;

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.pos < self.src.len() && self.src[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.src.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Result<f64, String> {
        let mut v = self.term()?;
        loop {
            if self.eat(b'+') {
                v += self.term()?;
            } else if self.eat(b'-') {
                v -= self.term()?;
            } else {
                return Ok(v);
            }
        }
    }

    fn term(&mut self) -> Result<f64, String> {
        let mut v = self.unary()?;
        loop {
            if self.eat(b'*') {
                v *= self.unary()?;
            } else if self.eat(b'/') {
                let d = self.unary()?;
                if d == 0.0 {
                    return Err("division by zero".into());
                }
                v /= d;
            } else if self.eat(b'%') {
                let d = self.unary()?;
                if d == 0.0 {
                    return Err("remainder by zero".into());
                }
                v %= d;
            } else {
                return Ok(v);
            }
        }
    }

    fn unary(&mut self) -> Result<f64, String> {
        if self.eat(b'-') {
            return Ok(-self.unary()?);
        }
        if self.eat(b'+') {
            return self.unary();
        }
        self.power()
    }

    fn power(&mut self) -> Result<f64, String> {
        let base = self.atom()?;
        if self.eat(b'^') {
            // Right-associative, and binds tighter than unary minus on its left: -2^2 = -4.
            let exp = self.unary()?;
            return Ok(base.powf(exp));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<f64, String> {
        self.skip_ws();
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("expression nested deeper than {MAX_DEPTH} levels"));
        }
        let r = self.atom_inner();
        self.depth -= 1;
        r
    }

    fn atom_inner(&mut self) -> Result<f64, String> {
        let start = self.pos;
        match self.src.get(self.pos) {
            None => Err("the expression ends too early".into()),
            Some(b'(') => {
                self.pos += 1;
                let v = self.expr()?;
                if !self.eat(b')') {
                    return Err(format!("missing ')' for '(' at position {}", start + 1));
                }
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() || *c == b'.' => {
                while self.pos < self.src.len()
                    && (self.src[self.pos].is_ascii_digit() || self.src[self.pos] == b'.' || self.src[self.pos] == b'_')
                {
                    self.pos += 1;
                }
                // Exponent part: 1e-3, 2.5E6.
                if matches!(self.src.get(self.pos), Some(b'e' | b'E'))
                    && matches!(self.src.get(self.pos + 1), Some(c) if c.is_ascii_digit() || *c == b'-' || *c == b'+')
                {
                    self.pos += 2;
                    while self.pos < self.src.len() && self.src[self.pos].is_ascii_digit() {
                        self.pos += 1;
                    }
                }
                let text: String = String::from_utf8_lossy(&self.src[start..self.pos]).replace('_', "");
                text.parse::<f64>().map_err(|_| format!("'{text}' at position {} is not a number", start + 1))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                while self.pos < self.src.len()
                    && (self.src[self.pos].is_ascii_alphanumeric() || self.src[self.pos] == b'_')
                {
                    self.pos += 1;
                }
                let name = String::from_utf8_lossy(&self.src[start..self.pos]).to_ascii_lowercase();
                match name.as_str() {
                    "pi" => return Ok(std::f64::consts::PI),
                    "e" => return Ok(std::f64::consts::E),
                    _ => {}
                }
                if !self.eat(b'(') {
                    return Err(format!("unknown name '{name}' at position {}", start + 1));
                }
                let mut args = vec![self.expr()?];
                while self.eat(b',') {
                    args.push(self.expr()?);
                }
                if !self.eat(b')') {
                    return Err(format!("missing ')' after the arguments of {name}"));
                }
                apply(&name, &args)
            }
            Some(c) => Err(format!("unexpected '{}' at position {}", *c as char, start + 1)),
        }
    }
}

fn apply(name: &str, args: &[f64]) -> Result<f64, String> {
    let one = |f: fn(f64) -> f64| {
        if args.len() == 1 { Ok(f(args[0])) } else { Err(format!("{name} takes one argument, got {}", args.len())) }
    };
    match name {
        "sqrt" if args.first().is_some_and(|x| *x < 0.0) => Err("sqrt of a negative number".into()),
        "ln" | "log10" if args.first().is_some_and(|x| *x <= 0.0) => {
            Err(format!("{name} of a number that is not positive"))
        }
        "sqrt" => one(f64::sqrt),
        "abs" => one(f64::abs),
        "ln" => one(f64::ln),
        "log10" => one(f64::log10),
        "exp" => one(f64::exp),
        "sin" => one(f64::sin),
        "cos" => one(f64::cos),
        "tan" => one(f64::tan),
        "round" => one(f64::round),
        "floor" => one(f64::floor),
        "ceil" => one(f64::ceil),
        "min" | "max" if args.is_empty() => Err(format!("{name} needs at least one argument")),
        "min" => Ok(args.iter().copied().fold(f64::INFINITY, f64::min)),
        "max" => Ok(args.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
        _ => Err(format!("unknown function '{name}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ToolContext, ToolErrorKind, ToolRegistry};

    #[test]
    fn arithmetic_follows_the_usual_rules() {
        assert_eq!(evaluate("7/2").unwrap(), 3.5);
        assert_eq!(evaluate("2 + 3 * 4").unwrap(), 14.0);
        assert_eq!(evaluate("(2 + 3) * 4").unwrap(), 20.0);
        assert_eq!(evaluate("2^3^2").unwrap(), 512.0);
        assert_eq!(evaluate("-2^2").unwrap(), -4.0);
        assert_eq!(evaluate("10 % 4").unwrap(), 2.0);
        assert_eq!(evaluate("sqrt(16) + max(1, 7, 3)").unwrap(), 11.0);
        assert_eq!(evaluate("1e3 + 1_000").unwrap(), 2000.0);
        assert!((evaluate("2*pi").unwrap() - std::f64::consts::TAU).abs() < 1e-12);
    }

    #[test]
    fn the_arithmetic_a_person_wrote_is_found_and_dates_are_not() {
        assert_eq!(expression_in("Calcula mi nota final: 0.6 * 8 + 0.4 * 6.5").as_deref(), Some("0.6 * 8 + 0.4 * 6.5"));
        assert_eq!(expression_in("¿Cuánto es 3+3?").as_deref(), Some("3+3"));
        assert_eq!(expression_in("what is (2 + 3) × 4.").as_deref(), Some("(2 + 3) * 4"));
        assert_eq!(expression_in("nota = 0,6 × 8 + 0,4 × 6,5").as_deref(), Some("0.6 * 8 + 0.4 * 6.5"));
        assert_eq!(expression_in("(media: 10 * 4) y luego 12 / 3 + 1").as_deref(), Some("12 / 3 + 1"));
        assert_eq!(expression_in("¿y 100 ÷ 8 - 3?").as_deref(), Some("100 / 8 - 3"));
        assert_eq!(expression_in("-2 + 5").as_deref(), Some("-2 + 5"));
        for none in [
            "¿Cuándo es el examen final y cuánto vale en la nota?",
            "El examen es el 20/01/2026 del curso 2025-2026.",
            "Estudia los temas 3 - 5 del curso 2025 - 2026; saqué un 8 / 10.",
            "Clase de 10:30 - 12:00, del 20/01 - 25/01, a las 10:00+01:00.",
            "Llama al +34-600-000-000 o al +1 800 555 0199.",
            "El proyecto vale el 60 % y el examen el 40 %.",
            "Llama al 958 24 30 00 o ve al Tema 1 + ejercicios.",
            "Tengo un 8, un 6.5 y un 7.",
            "",
        ] {
            assert_eq!(expression_in(none), None, "{none}");
        }
        // Hostile input: long, and nothing in it evaluates.
        assert_eq!(expression_in(&"1+".repeat(10_000)), None);
    }

    #[test]
    fn a_decimal_comma_is_read_as_a_point_where_nothing_else_can_mean_it() {
        assert_eq!(evaluate("0.6 * 8 + 0.4 * 6,5").unwrap(), 0.6 * 8.0 + 0.4 * 6.5);
        assert_eq!(evaluate("0,25 * 4").unwrap(), 1.0);
        // A function's arguments, and a thousands separator, are not decimals.
        assert_eq!(evaluate("max(1,7)").unwrap(), 7.0);
        assert!(evaluate("1,000 + 2").unwrap_err().contains("unexpected ','"));
        assert!(evaluate("1,5,2").is_err());
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        assert_eq!(evaluate("1/0").unwrap_err(), "division by zero");
        assert!(evaluate("2 +").unwrap_err().contains("ends too early"));
        assert!(evaluate("(1 + 2").unwrap_err().contains("missing ')'"));
        assert!(evaluate("foo(1)").unwrap_err().contains("unknown function 'foo'"));
        assert!(evaluate("x + 1").unwrap_err().contains("unknown name 'x'"));
        assert!(evaluate("1 $ 2").unwrap_err().contains("unexpected '$'"));
        assert!(evaluate("sqrt(-1)").unwrap_err().contains("negative"));
        assert!(evaluate(&"(".repeat(10_000)).unwrap_err().contains("nested deeper"));
        assert!(evaluate("10^400").unwrap_err().contains("not a finite"));
    }

    #[tokio::test]
    async fn the_tool_reports_results_and_rounding() {
        let mut reg = ToolRegistry::new();
        reg.register(calculator()).unwrap();
        let ctx = ToolContext::default();
        let out = reg.call(&ctx, "calculator", &serde_json::json!({"expression": "10/3", "decimals": 2})).await;
        assert_eq!(out.to_json()["result"], serde_json::json!(3.33));
        let out = reg.call(&ctx, "calculator", &serde_json::json!({"expression": "1/0"})).await;
        assert_eq!(out.error().unwrap().kind, ToolErrorKind::InvalidArguments);
        let out = reg.call(&ctx, "calculator", &serde_json::json!({"expression": "1", "decimals": 99})).await;
        assert!(out.error().unwrap().message.contains("/decimals"));
    }
}
