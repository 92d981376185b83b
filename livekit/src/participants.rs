//! The room's participants as the server's updates describe them: who joined, who left,
//! whose microphone is muted. Plain code over the updates (property-tested against any
//! update the server, or an attacker in its place, could send).

use std::collections::HashMap;

use livekit_protocol as proto;

use crate::RoomEvent;

/// What one participant update means for the room, given the names known so far (by
/// participant sid), which it updates.
pub(crate) fn on_update(
    names: &mut HashMap<String, String>,
    update: proto::ParticipantUpdate,
) -> Vec<RoomEvent> {
    let mut events = Vec::new();
    for p in update.participants {
        if p.state == proto::participant_info::State::Disconnected as i32 {
            if names.remove(&p.sid).is_some() {
                events.push(RoomEvent::ParticipantLeft {
                    identity: p.identity,
                });
            }
            continue;
        }
        if !names.contains_key(&p.sid) {
            names.insert(p.sid.clone(), p.identity.clone());
            events.push(RoomEvent::ParticipantJoined {
                identity: p.identity.clone(),
            });
        }
        let audio: Vec<_> = p
            .tracks
            .iter()
            .filter(|t| t.r#type == proto::TrackType::Audio as i32)
            .collect();
        if !audio.is_empty() {
            events.push(RoomEvent::MicrophoneMuted {
                identity: p.identity,
                muted: audio.iter().all(|t| t.muted),
            });
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message as _;

    fn participant(sid: u8, state: i32, tracks: Vec<(i32, bool)>) -> proto::ParticipantInfo {
        proto::ParticipantInfo {
            sid: format!("PA_{sid}"),
            identity: format!("p{sid}"),
            state,
            tracks: tracks
                .into_iter()
                .map(|(r#type, muted)| proto::TrackInfo {
                    r#type,
                    muted,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Any sequence of updates: each participant joins once until it leaves, leaves
        /// only after joining, and the names known are those not gone.
        #[test]
        fn joins_and_leaves_stay_paired(
            updates in prop::collection::vec(
                prop::collection::vec(
                    (0u8..4, -1i32..5, prop::collection::vec((-1i32..4, any::<bool>()), 0..3)),
                    0..4,
                ),
                0..24,
            )
        ) {
            let mut names = HashMap::new();
            let mut present: HashMap<String, bool> = HashMap::new();
            let mut last_state: HashMap<u8, i32> = HashMap::new();
            for update in updates {
                let participants = update
                    .into_iter()
                    .map(|(sid, state, tracks)| {
                        last_state.insert(sid, state);
                        participant(sid, state, tracks)
                    })
                    .collect();
                for event in on_update(&mut names, proto::ParticipantUpdate { participants }) {
                    match event {
                        RoomEvent::ParticipantJoined { identity } => {
                            prop_assert!(!present.insert(identity, true).unwrap_or(false));
                        }
                        RoomEvent::ParticipantLeft { identity } => {
                            prop_assert!(present.insert(identity, false).unwrap_or(false));
                        }
                        RoomEvent::MicrophoneMuted { identity, .. } => {
                            prop_assert!(present.get(&identity).copied().unwrap_or(false));
                        }
                        other => prop_assert!(false, "unexpected {other:?}"),
                    }
                }
            }
            let disconnected = proto::participant_info::State::Disconnected as i32;
            for (sid, state) in last_state {
                prop_assert_eq!(names.contains_key(&format!("PA_{sid}")), state != disconnected);
            }
        }

        /// Any bytes the signal connection could carry: decoded or refused, never a panic.
        #[test]
        fn any_signal_bytes_are_handled(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut names = HashMap::new();
            if let Ok(proto::SignalResponse { message: Some(proto::signal_response::Message::Update(update)) }) =
                proto::SignalResponse::decode(&bytes[..])
            {
                let _ = on_update(&mut names, update);
            }
        }
    }
}
