//! [`StopScanner`]: a request's stop sequences over streamed text. A stop sequence may arrive
//! split across several decoded pieces, so text that could be the start of one is held back
//! until the next piece settles it: nothing of a stop sequence is ever streamed.

/// Holds back the tail of the streamed text that could still begin a stop sequence.
#[derive(Debug)]
pub(crate) struct StopScanner {
    stops: Vec<String>,
    held: String,
}

/// What [`StopScanner::push`] lets through.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Released {
    /// Text that can be streamed now.
    pub text: String,
    /// A stop sequence was completed: `text` ends right before it and generation ends.
    pub stopped: bool,
}

impl StopScanner {
    /// A scanner for `stops` (empty strings are ignored).
    pub(crate) fn new(stops: &[String]) -> Self {
        Self { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Adds a decoded piece; returns what may be streamed.
    pub(crate) fn push(&mut self, piece: &str) -> Released {
        if self.stops.is_empty() {
            return Released { text: piece.to_owned(), stopped: false };
        }
        self.held.push_str(piece);
        // Any stop sequence starts inside `held` (see `undecided_tail`), so searching it is enough.
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return Released { text, stopped: true };
        }
        let keep = self.undecided_tail();
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        Released { text, stopped: false }
    }

    /// The held text once generation ended without a stop sequence.
    pub(crate) fn finish(self) -> String {
        self.held
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop
    /// sequence: the only text whose fate the next pieces decide.
    fn undecided_tail(&self) -> usize {
        let held = self.held.as_str();
        self.stops
            .iter()
            .filter_map(|stop| {
                let longest = (stop.len() - 1).min(held.len());
                (1..=longest)
                    .rev()
                    .find(|&k| held.is_char_boundary(held.len() - k) && stop.starts_with(&held[held.len() - k..]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `pieces` through a scanner for `stops`: (streamed text, stopped).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopScanner::new(&stops.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        let mut out = String::new();
        for p in pieces {
            let r = s.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn a_stop_sequence_split_across_pieces_is_never_streamed() {
        assert_eq!(run(&["###"], &["Answer: 4", "2 #", "#", "# more"]), ("Answer: 42 ".into(), true));
        // Within one piece, with text after it.
        assert_eq!(run(&["\nUser:"], &["Hi.\nUser: next"]), ("Hi.".into(), true));
        // The earliest of several stop sequences wins.
        assert_eq!(run(&["END", "ND!"], &["done E", "ND!"]), ("done ".into(), true));
    }

    #[test]
    fn held_text_that_turns_out_not_to_be_a_stop_is_released() {
        let mut s = StopScanner::new(&["###".to_owned()]);
        assert_eq!(s.push("a #"), Released { text: "a ".into(), stopped: false });
        assert_eq!(s.push("#"), Released { text: String::new(), stopped: false });
        assert_eq!(s.push("x"), Released { text: "##x".into(), stopped: false });
        // The end of generation releases what is still held.
        assert_eq!(run(&["###"], &["a ##"]), ("a ##".into(), false));
    }

    #[test]
    fn multibyte_text_is_split_only_at_character_boundaries() {
        // "é" shares its first byte with nothing here, but the prefix check must not slice it.
        assert_eq!(run(&["éé!"], &["café", "é", "!"]), ("caf".into(), true));
        assert_eq!(run(&["Điều"], &["xin chào Đi", "ều 5"]), ("xin chào ".into(), true));
        assert_eq!(run(&["Điều"], &["Đi", "ện"]), ("Điện".into(), false));
    }

    #[test]
    fn without_stop_sequences_every_piece_passes_at_once() {
        let mut s = StopScanner::new(&[String::new()]);
        assert_eq!(s.push("###"), Released { text: "###".into(), stopped: false });
    }
}
