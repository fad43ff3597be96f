//! The course tutor's tools (docs/course.md): `rag_search` over the course documents and the
//! body of `POST /search` ([`search`]), the teaching guides and `get_guia` ([`guides`],
//! [`guia`]), and `generate_test` ([`test_gen`]).

pub mod guia;
pub mod guides;
pub mod search;
pub mod test_gen;

pub use search::{CourseSearch, RagSearchArgs, rag_search_tool};
