//! Whole-word matching: where a word occurs in a text with no letter or digit on either side
//! (the crisis directory's region names, the legal eval's verdict words).

/// The byte offsets where `word` occurs in `text` with no letter or digit on either side.
pub fn positions<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    text.match_indices(word).map(|(i, _)| i).filter(move |&i| {
        !word.is_empty()
            && text[..i].chars().next_back().is_none_or(|c| !c.is_alphanumeric())
            && text[i + word.len()..].chars().next().is_none_or(|c| !c.is_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_whole_words_count() {
        assert_eq!(super::positions("london, uk", "uk").collect::<Vec<_>>(), [8]);
        assert_eq!(super::positions("ukraine", "uk").count(), 0);
        assert_eq!(super::positions("x", "").count(), 0);
    }
}
