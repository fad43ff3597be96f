//! [`State`]: typed graph state made of channels, each with a reducer.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The state a graph works on.
///
/// Each field is a channel; a node returns an [`State::Update`] naming new values for some
/// channels, and [`State::apply`] is where each channel's reducer lives: append for the
/// message log, replace for scalars, anything custom. The update is also the unit of
/// storage: a checkpoint stores the updates of its step, never the whole state, so a
/// thread's storage grows with its steps (O(N)), not with steps × size (O(N²)).
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use toolgraph_graph::State;
///
/// #[derive(Clone, Default, Serialize, Deserialize)]
/// struct Chat { log: Vec<String>, topic: Option<String> }
///
/// #[derive(Clone, Default, Serialize, Deserialize)]
/// struct ChatUpdate { log: Vec<String>, topic: Option<String> }
///
/// impl State for Chat {
///     type Update = ChatUpdate;
///     fn apply(&mut self, u: ChatUpdate) {
///         self.log.extend(u.log);              // append
///         if u.topic.is_some() { self.topic = u.topic; } // replace when set
///     }
/// }
/// ```
pub trait State: Clone + Default + Send + Sync + Serialize + DeserializeOwned + 'static {
    /// A partial update: new values for some channels.
    type Update: Send + Sync + Serialize + DeserializeOwned + 'static;

    /// Applies an update with each channel's reducer.
    fn apply(&mut self, update: Self::Update);
}
