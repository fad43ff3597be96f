//! Facts that pair a number with what it counts: a day with its month (`date:1-20` for "20 de
//! enero", "January 20th", "ngày 20 tháng 1", "1월 20일", "20/01") and an amount with a
//! currency (`amount:100` for "100 euros", "$100", "100원").
//!
//! The grounding check holds each number and month of a reply to its sources on its own, so a
//! reply that moves a day to another month ("la extraordinaria es el 20 de julio", where one
//! passage has "20 de enero" and another "julio") or a percentage into a price ("la matrícula
//! cuesta 100 euros", where a passage has "100 %") states only facts its sources hold. The
//! pairs are facts too: a source holds one when it writes it, or writes its parts — the day
//! and the month, the number and a currency — apart (a range, a list, a table), but not when
//! two sources hold one part each (docs/retrieval.md, "Check every sentence").

/// A piece of text the pairs are read from.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    /// A run of digits (with `.`/`,` between digits), its value when it is a whole number.
    Number(Option<u32>, String),
    /// A word, lowercased.
    Word(String),
    /// Any other character but a space.
    Mark(char),
}

/// Words that join a day to its month: "20 de enero", "the 20th of January".
const DAY_MONTH_JOINS: [&str; 3] = ["de", "of", "del"];

/// Ordinal endings a day is written with ("20th", "1st", "1º de julio", "1er juillet").
const ORDINAL_ENDINGS: [&str; 7] = ["st", "nd", "rd", "th", "º", "ª", "er"];

/// Currency names and codes written after an amount, or before it ("USD 100").
const CURRENCY_WORDS: [&str; 22] = [
    "euro", "euros", "eur", "dólar", "dólares", "dolar", "dolares", "dollar", "dollars", "usd", "peso", "pesos",
    "libras", "pounds", "gbp", "đồng", "vnd", "vnđ", "đ", "won", "yen", "jpy",
];

/// What Korean writes after "원" (won) in "100원입니다", "100원이에요", "100원짜리".
const WON_ENDINGS: [&str; 12] = ["입", "이", "을", "의", "에", "으", "예", "씩", "짜", "정", "까", "부"];

/// The fact a source holds when it names a currency anywhere: an amount it writes apart from
/// its currency (a range, a table) is held by its number.
pub(super) const CURRENCY: &str = "amount:currency";

/// Currency signs written before or after an amount.
const CURRENCY_SIGNS: [char; 6] = ['€', '$', '£', '¥', '₫', '₩'];

fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() {
            let mut j = i;
            while j < chars.len()
                && (chars[j].is_ascii_digit()
                    || (matches!(chars[j], '.' | ',') && chars.get(j + 1).is_some_and(char::is_ascii_digit) && j > i))
            {
                j += 1;
            }
            let raw: String = chars[i..j].iter().collect();
            out.push(Token::Number(raw.parse().ok(), raw));
            i = j;
        } else if c.is_alphabetic() {
            let mut j = i;
            while j < chars.len() && chars[j].is_alphabetic() {
                j += 1;
            }
            out.push(Token::Word(chars[i..j].iter().collect::<String>().to_lowercase()));
            i = j;
        } else {
            if !c.is_whitespace() {
                out.push(Token::Mark(c));
            }
            i += 1;
        }
    }
    out
}

/// The `date:M-D` and `amount:N` facts of `text`; `source`: also the other reading of a
/// `d/m` date (a source's `01/02` may be either; a reply's is read day first, as the months
/// elsewhere in this check are), whether it names a currency, and "may" or "mai" as a month
/// (in a reply they are no month, as in the rest of the check).
pub(super) fn paired_facts(text: &str, source: bool) -> Vec<String> {
    use super::grounding::{AMBIGUOUS, month_of, number_key};
    let month_of = |w: &str| month_of(w).filter(|_| source || !AMBIGUOUS.contains(&w));
    let t = tokens(text);
    let mut out = Vec::new();
    let day = |k: usize| match t.get(k) {
        Some(Token::Number(Some(d), _)) if (1..=31).contains(d) => Some(*d as usize),
        _ => None,
    };
    let month_word = |k: usize| match t.get(k) {
        Some(Token::Word(w)) => month_of(w),
        _ => None,
    };
    let word_is = |k: usize, words: &[&str]| matches!(t.get(k), Some(Token::Word(w)) if words.contains(&w.as_str()));
    let mut date = |month: usize, day: usize| out.push(format!("date:{month}-{day}"));
    for k in 0..t.len() {
        // "20 de enero", "20 January", "the 20th of January".
        if let Some(d) = day(k) {
            let mut m = k + 1;
            while word_is(m, &DAY_MONTH_JOINS) || word_is(m, &ORDINAL_ENDINGS) {
                m += 1;
            }
            if m - k <= 3
                && let Some(month) = month_word(m)
            {
                date(month, d);
            }
            // "20/01".
            if t.get(k + 1) == Some(&Token::Mark('/'))
                && let Some(second) = day(k + 2)
            {
                if (1..=12).contains(&second) {
                    date(second, d);
                }
                if source && d <= 12 {
                    date(d, second);
                }
            }
        }
        // "January 20", "January 20th".
        if let Some(month) = month_word(k)
            && let Some(d) = day(k + 1)
        {
            date(month, d);
        }
        // "ngày 20 tháng 1".
        if word_is(k, &["ngày"])
            && let Some(d) = day(k + 1)
            && word_is(k + 2, &["tháng"])
            && let Some(Token::Number(Some(m), _)) = t.get(k + 3)
            && (1..=12).contains(m)
        {
            date(*m as usize, d);
        }
        // "1월 20일".
        if let Some(Token::Number(Some(m), _)) = t.get(k)
            && (1..=12).contains(m)
            && word_is(k + 1, &["월"])
            && let Some(d) = day(k + 2)
            && matches!(t.get(k + 3), Some(Token::Word(w)) if w.starts_with('일'))
        {
            date(*m as usize, d);
        }
    }
    // "100 euros", "100 €", "$100", "€ 100", "USD 100", "100원".
    let currency = |at: Option<usize>| match at.and_then(|a| t.get(a)) {
        Some(Token::Mark(c)) => CURRENCY_SIGNS.contains(c),
        Some(Token::Word(w)) => {
            // Korean writes what follows into the word ("100원입니다"), not "원칙" (principle).
            CURRENCY_WORDS.contains(&w.as_str())
                || w.strip_prefix('원')
                    .is_some_and(|rest| rest.is_empty() || WON_ENDINGS.iter().any(|e| rest.starts_with(e)))
        }
        _ => false,
    };
    for k in 0..t.len() {
        let Some(Token::Number(_, raw)) = t.get(k) else { continue };
        if currency(k.checked_sub(1)) || currency(Some(k + 1)) {
            out.push(format!("amount:{}", number_key(raw)));
        }
    }
    if source && (0..t.len()).any(|k| currency(Some(k))) {
        out.push(CURRENCY.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str, source: bool) -> Vec<String> {
        let mut found = paired_facts(text, source);
        found.sort();
        found
    }

    #[test]
    fn a_day_is_paired_with_its_month_as_each_language_writes_it() {
        for written in [
            "El examen es el 20 de enero.",
            "The exam is on January 20th.",
            "The exam is on the 20th of January.",
            "The exam is on 20 January 2027.",
            "Thi cuối kỳ vào ngày 20 tháng 1.",
            "기말 시험은 1월 20일입니다.",
            "Examen: 20/01.",
            "El 20º de enero.",
        ] {
            assert_eq!(pairs(written, false), ["date:1-20"], "{written}");
        }
        // A source's `d/m` may be read the other way too; a reply's is day first.
        assert_eq!(pairs("01/02", true), ["date:1-2", "date:2-1"]);
        assert_eq!(pairs("01/02", false), ["date:2-1"]);
        // Not days: a year, a number far from the month, a percentage, a month alone.
        assert!(pairs("En 2026, enero fue frío.", false).is_empty());
        assert!(pairs("Son 20 alumnos y en julio hay examen.", false).is_empty());
        assert!(pairs("Vale el 100 % de la nota en julio.", false).is_empty());
        // "may" is a month only in a source: a reply's "20 may pass" claims no date.
        assert!(pairs("Those under 20 may not pass.", false).is_empty());
        assert_eq!(pairs("Exam: 20 May.", true), ["date:5-20"]);
    }

    #[test]
    fn an_amount_is_a_number_with_a_currency() {
        assert_eq!(pairs("La matrícula cuesta 100 euros.", false), ["amount:100"]);
        assert_eq!(pairs("It costs $49.99, or €45.", false), ["amount:45", "amount:49.99"]);
        assert_eq!(pairs("Học phí là 500 đồng.", false), ["amount:500"]);
        assert_eq!(pairs("책은 100원입니다.", false), ["amount:100"]);
        assert_eq!(pairs("Cuesta USD 100.", false), ["amount:100"]);
        assert!(pairs("3 원칙이 있습니다.", false).is_empty(), "원칙 is a principle, not won");
        // A source that names a currency anywhere says so (its amounts may be written apart).
        assert_eq!(pairs("Tasas: entre 300 y 600 euros.", true), ["amount:600", "amount:currency"]);
        // A percentage, credits, a plain number: no amount.
        assert!(pairs("Vale el 100 % de la nota; 6 créditos.", false).is_empty());
    }
}
