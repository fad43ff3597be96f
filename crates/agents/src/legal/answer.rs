//! `generate_answer`: the model answers a question from the given articles of law alone, and
//! says so when they do not hold the answer.

use super::Chunk;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_llm::{ChatModel, ChatRequest, LlmError, Message};

/// The sentence an answer gives when the articles do not hold the answer; it is never cited.
pub const NO_ANSWER: &str = "Các điều luật tìm được không chứa câu trả lời cho câu hỏi này.";

/// How much of one article the model reads (long articles are cut here; the retrieval's best
/// chunk of an article comes first).
const MAX_CHUNK_CHARS: usize = 2_400;

/// How long one answer may take (a local model reads a few thousand tokens of law first).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(240);

/// What `generate_answer` writes with.
#[derive(Clone)]
pub struct AnswerWriter {
    /// The model; `None`: every call fails as unavailable, saying why.
    pub model: Option<Arc<dyn ChatModel>>,
}

/// Why no answer was written.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// No model is configured.
    #[error("no model is configured to write answers")]
    NoModel,
    /// The model failed.
    #[error("the model failed: {0}")]
    Model(#[from] LlmError),
    /// The model took too long.
    #[error("the model did not answer within {0:?}")]
    Timeout(Duration),
}

impl AnswerWriter {
    /// The model's answer to `question` from `chunks`; [`NO_ANSWER`] without calling the
    /// model when there are no chunks, and when the model answers nothing.
    ///
    /// # Errors
    /// See [`AnswerError`].
    pub async fn generate(&self, question: &str, chunks: &[Chunk]) -> Result<String, AnswerError> {
        if chunks.is_empty() {
            return Ok(NO_ANSWER.to_owned());
        }
        let model = self.model.as_ref().ok_or(AnswerError::NoModel)?;
        let reply = tokio::time::timeout(ANSWER_TIMEOUT, model.complete(request(question, chunks)))
            .await
            .map_err(|_| AnswerError::Timeout(ANSWER_TIMEOUT))??;
        toolgraph_llm::usage::report(model.model_id(), reply.usage);
        // A blank answer is no answer: the citation step and the reader get the text that says so.
        let answer = reply.content.trim();
        Ok(if answer.is_empty() { NO_ANSWER.to_owned() } else { answer.to_owned() })
    }
}

/// A worked example the model reads before a multiple-choice question, as a turn of its own:
/// the form of an answer (the letter, then the rule it rests on with the article's label) is
/// what a small model copies. With it the 1.5B chose the right letter in 45 % of the ALQAC
/// multiple-choice questions instead of 25 % (chance), and 88 % of the articles it cited were
/// gold ones (85 % before); examples before true/false questions made it answer "Sai." to 46 of
/// 50 and are not given (docs/benchmarks.md, the legal evaluation). The articles are real ones of the Vietnamese
/// laws that no evaluation question asks about; the same in every request, the example stays
/// in the model's cache of computed prompts.
const CHOICE_EXAMPLE: Example = Example {
    articles: &[
        (
            "Điều 564, Bộ luật dân sự",
            "Ủy quyền lại\n\n1. Bên được ủy quyền được ủy quyền lại cho người khác trong trường hợp sau \
             đây:\n\na) Có sự đồng ý của bên ủy quyền;\n\nb) Do sự kiện bất khả kháng nếu không áp dụng ủy \
             quyền lại thì mục đích xác lập, thực hiện giao dịch dân sự vì lợi ích của người ủy quyền không \
             thể thực hiện được.\n\n2. Việc ủy quyền lại không được vượt quá phạm vi ủy quyền ban đầu.",
        ),
        (
            "Điều 479, Bộ luật dân sự",
            "Nghĩa vụ bảo quản tài sản thuê\n\n1. Bên thuê phải bảo quản tài sản thuê, phải bảo dưỡng và sửa \
             chữa nhỏ; nếu làm mất, hư hỏng thì phải bồi thường.",
        ),
    ],
    question: "Bên được ủy quyền được ủy quyền lại cho người khác trong trường hợp nào?\nA. Có sự đồng ý của \
               bên ủy quyền\nB. Bên được ủy quyền không muốn tiếp tục công việc\nC. Bên thuê tài sản đồng \
               ý\nD. Cả 3 phương án trên",
    answer: "A. Theo [Điều 564, Bộ luật dân sự], bên được ủy quyền được ủy quyền lại cho người khác khi có sự \
             đồng ý của bên ủy quyền, hoặc do sự kiện bất khả kháng.",
};

/// Whether `question` lists choices: lines that open with "A." and "B." after it.
fn lists_choices(question: &str) -> bool {
    let opens = |letter: &str| question.lines().skip(1).any(|l| l.trim_start().starts_with(letter));
    opens("A.") && opens("B.")
}

/// A question answered from articles, shown to the model before the real one.
struct Example {
    articles: &'static [(&'static str, &'static str)],
    question: &'static str,
    answer: &'static str,
}

/// The user message that asks `question` about `articles` (each a label and its text).
fn asking<'a>(question: &str, articles: impl Iterator<Item = (String, &'a str)>) -> String {
    let mut out = String::from("Các điều luật:\n\n");
    for (i, (label, text)) in articles.enumerate() {
        let text = match text.char_indices().nth(MAX_CHUNK_CHARS) {
            Some((cut, _)) => format!("{} …", &text[..cut]),
            None => text.to_owned(),
        };
        out.push_str(&format!("[{}] {label}\n{}\n\n", i + 1, text.trim()));
    }
    out.push_str(&format!("Câu hỏi: {}", question.trim()));
    out
}

/// The request that answers `question` from `chunks`: deterministic (temperature 0), the rules
/// in the system prompt, the worked [`CHOICE_EXAMPLE`] when the question lists choices, then the
/// question with its articles numbered and labelled.
pub fn request(question: &str, chunks: &[Chunk]) -> ChatRequest {
    let system = format!(
        "Bạn là trợ lý pháp lý. Chỉ trả lời dựa trên các điều luật được cung cấp, không dùng hiểu biết nào \
         khác. Nếu các điều luật không chứa câu trả lời, chỉ trả lời: \"{NO_ANSWER}\"\n\
         Trả lời ngắn gọn (tối đa 3 câu), bằng ngôn ngữ của câu hỏi, và nêu lại quy định làm căn cứ.\n\
         Câu hỏi đúng/sai: câu đầu tiên chỉ là \"Đúng.\" hoặc \"Sai.\".\n\
         Câu hỏi trắc nghiệm: câu đầu tiên chỉ là chữ cái của phương án đúng, ví dụ \"B.\"."
    );
    let mut messages = vec![Message::system(system)];
    if lists_choices(question) {
        let e = &CHOICE_EXAMPLE;
        messages.push(Message::user(asking(e.question, e.articles.iter().map(|(l, t)| ((*l).to_owned(), *t)))));
        messages.push(Message::assistant(e.answer));
    }
    messages.push(Message::user(asking(question, chunks.iter().map(|c| (c.meta.label(), c.text.as_str())))));
    let mut request = ChatRequest::new(messages);
    request.temperature = Some(0.0);
    request.max_tokens = Some(300);
    request
}

/// The verdict of an answer to a true-or-false question: the first of "đúng" (true), "sai"
/// or "không đúng" (false) it says, as a word ("Sai. …", "Câu hỏi đúng.", "**Đúng**"); `None`
/// when it says neither.
pub fn true_or_false(answer: &str) -> Option<bool> {
    let lower = answer.to_lowercase();
    let first = |word: &str| crate::words::positions(&lower, word).next();
    let candidates = [(first("không đúng"), false), (first("đúng"), true), (first("sai"), false)];
    // "không đúng" starts before the "đúng" inside it, so it wins that tie.
    candidates.into_iter().filter_map(|(at, v)| Some((at?, v))).min_by_key(|(at, _)| *at).map(|(_, v)| v)
}

/// The choice an answer to a multiple-choice question names: the first letter A–D standing
/// alone ("B.", "đúng: C", "(D)"); `None` when there is none.
pub fn choice(answer: &str) -> Option<char> {
    ["A", "B", "C", "D"]
        .iter()
        .filter_map(|l| crate::words::positions(answer, l).next().map(|at| (at, *l)))
        .min_by_key(|(at, _)| *at)
        .and_then(|(_, l)| l.chars().next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legal::ChunkMeta;

    #[test]
    fn true_or_false_is_the_first_verdict_said() {
        assert_eq!(true_or_false("Đúng. Theo …"), Some(true));
        assert_eq!(true_or_false("**Sai**, vì … đúng"), Some(false));
        assert_eq!(true_or_false("Câu hỏi đúng."), Some(true));
        assert_eq!(true_or_false("Câu hỏi không đúng, vì …"), Some(false));
        assert_eq!(true_or_false("Sai lầm"), Some(false), "'sai' alone is a word here");
        assert_eq!(true_or_false("Chính phủ."), None);
        assert_eq!(true_or_false("đúngđắn"), None);
    }

    #[test]
    fn a_choice_is_a_letter_standing_alone() {
        assert_eq!(choice("B. Dịch vụ ăn uống"), Some('B'));
        assert_eq!(choice("Câu trả lời đúng là: C. 03 tháng"), Some('C'), "the C of 'Câu' is no choice");
        assert_eq!(choice("(D) Cả 3 phương án"), Some('D'));
        assert_eq!(choice("Chính phủ."), None);
    }

    #[test]
    fn the_request_numbers_the_articles_and_cuts_long_ones() {
        let long = "x".repeat(MAX_CHUNK_CHARS + 100);
        let chunks = [Chunk {
            text: long,
            meta: ChunkMeta { doc_id: "L#1".into(), article_number: "1".into(), law: "L".into(), ..Default::default() },
        }];
        let r = request("Hỏi?", &chunks);
        let user = r.messages.last().expect("the question").content();
        assert!(user.contains("[1] Điều 1, L\n"), "{user}");
        assert!(user.contains(" …") && user.len() < MAX_CHUNK_CHARS + 200, "the article was not cut");
        assert_eq!(r.temperature, Some(0.0));
    }

    #[test]
    fn a_question_with_choices_comes_after_the_worked_example() {
        let chunks = [Chunk::default()];
        let choices = "Ai quản lý?\nA. Quốc hội\nB. Chính phủ\nC. Bộ\nD. Cả 3";
        let r = request(choices, &chunks);
        assert_eq!(r.messages.len(), 4);
        let e = &CHOICE_EXAMPLE;
        assert!(matches!(r.messages[1], Message::User { .. }) && r.messages[1].content().ends_with(e.question));
        assert_eq!(r.messages[2].content(), e.answer);
        assert!(r.messages[3].content().ends_with(&format!("Câu hỏi: {choices}")));
        // The example cites an article it shows, and its letter reads as a choice.
        assert!(e.articles.iter().any(|(label, _)| e.answer.contains(&format!("[{label}]"))));
        assert_eq!(choice(e.answer), Some('A'));
        assert!(lists_choices(e.question));
        // Other questions are asked alone.
        for q in ["Phim có cần giấy phép không, đúng hay sai?", "Ai là A. và ai là B.?"] {
            assert_eq!(request(q, &chunks).messages.len(), 2, "{q}");
        }
    }

    #[tokio::test]
    async fn no_chunks_means_no_answer_and_no_model_means_an_error() {
        let writer = AnswerWriter { model: None };
        assert_eq!(writer.generate("q", &[]).await.unwrap(), NO_ANSWER);
        assert!(matches!(writer.generate("q", &[Chunk::default()]).await, Err(AnswerError::NoModel)));
    }
}
