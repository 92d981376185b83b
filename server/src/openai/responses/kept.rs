//! Responses kept in memory for `previous_response_id`: each one's whole conversation
//! (its input, the responses it continued, and its output), bounded in number and in
//! bytes, the oldest dropped first. A process's restart forgets them all.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sublet_engine::Message;

/// Most responses kept.
pub const KEPT_MOST: usize = 256;
/// Most bytes of text kept, all responses together.
const KEPT_BYTES: usize = 64 << 20;

/// The kept responses, shared by the server's requests.
#[derive(Debug, Clone, Default)]
pub struct Kept(Arc<Mutex<Store>>);

#[derive(Debug, Default)]
struct Store {
    /// Oldest first.
    order: VecDeque<String>,
    by_id: HashMap<String, (Arc<[Message]>, usize)>,
    bytes: usize,
}

impl Kept {
    /// The conversation the response `id` ended with, if it is kept.
    pub fn get(&self, id: &str) -> Option<Arc<[Message]>> {
        let store = self.0.lock().unwrap_or_else(|e| e.into_inner());
        store
            .by_id
            .get(id)
            .map(|(messages, _)| Arc::clone(messages))
    }

    /// Keeps `conversation` as response `id`'s, dropping the oldest beyond the bounds. A
    /// conversation larger than every bound together is not kept.
    pub fn keep(&self, id: String, conversation: Vec<Message>) {
        let bytes = conversation_bytes(&conversation);
        if bytes > KEPT_BYTES {
            return;
        }
        let mut store = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while store.order.len() >= KEPT_MOST || store.bytes + bytes > KEPT_BYTES {
            let Some(oldest) = store.order.pop_front() else {
                break;
            };
            if let Some((_, freed)) = store.by_id.remove(&oldest) {
                store.bytes -= freed;
            }
        }
        store.bytes += bytes;
        store.order.push_back(id.clone());
        store.by_id.insert(id, (conversation.into(), bytes));
    }
}

fn conversation_bytes(conversation: &[Message]) -> usize {
    conversation
        .iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                    .sum::<usize>()
                + m.tool_call_id.as_ref().map_or(0, String::len)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sublet_engine::Role;

    #[test]
    fn the_oldest_go_first_beyond_the_bound() {
        let kept = Kept::default();
        for i in 0..KEPT_MOST + 2 {
            kept.keep(
                format!("r{i}"),
                vec![Message::new(Role::User, format!("{i}"))],
            );
        }
        assert!(kept.get("r0").is_none() && kept.get("r1").is_none());
        let last = kept.get(&format!("r{}", KEPT_MOST + 1)).unwrap();
        assert_eq!(last[0].content, format!("{}", KEPT_MOST + 1));
        assert!(kept.get("r2").is_some());
        // A conversation over the byte bound is not kept, and drops nothing.
        kept.keep(
            "huge".into(),
            vec![Message::new(Role::User, "x".repeat(KEPT_BYTES + 1))],
        );
        assert!(kept.get("huge").is_none() && kept.get("r2").is_some());
    }
}
