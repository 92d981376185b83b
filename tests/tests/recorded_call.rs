//! A recorded call through the whole pipeline on the real models and the real engine.

use std::sync::Arc;

use sublet_agent::{AgentConfig, IdleModels, Pacing, Persona, Quiet, VoiceAgent};
use sublet_audio::{read_wav, SPEECH_RATE};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{
    ChatRequest, Engine, EngineConfig, Message, Role, StreamEvent, VOICE_PRIORITY,
};
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};
use sublet_tests::official_clients::question_between_quiet;

#[test]
fn a_three_turn_call_gets_three_timed_replies() {
    let cache = ModelCache::from_env();
    let call = read_wav(cache.call("three_turns.wav").unwrap()).unwrap();
    let agent = VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap();
    let outcome = agent
        .answer_recording(&call, Pacing::Fast, SPEECH_RATE, &mut Quiet)
        .unwrap();
    println!("{}", sublet_agent::turn_table(&outcome.turns));
    assert_eq!(outcome.turns.len(), 3, "{:#?}", outcome.turns);
    for turn in &outcome.turns {
        assert!(
            !turn.transcript.is_empty() && !turn.reply.is_empty(),
            "{turn:?}"
        );
        let times = turn.stage_times();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "stage times out of order: {times:?}"
        );
        assert!(turn.end_of_turn_s > turn.caller_stop_s, "{turn:?}");
    }
    // The agent's audio is where the timeline says, and it says the reply.
    let first = &outcome.turns[0];
    let reply = &outcome.reply.audio;
    let start = (first.first_audio_s * SPEECH_RATE as f64) as usize;
    let before = &reply.samples[..start];
    assert!(
        before.iter().all(|s| s.abs() < 1e-4),
        "agent audio before its first_audio_s"
    );
    let spoken = &reply.samples[start..(start + 8 * SPEECH_RATE as usize).min(reply.samples.len())];
    let mut stt = Transcriber::load(&cache).unwrap();
    let heard = stt.transcribe(spoken).unwrap();
    let first_sentence = first.reply.split_inclusive(['.', '!', '?']).next().unwrap();
    let wer = word_error_rate(
        first_sentence,
        heard.split_inclusive(['.', '!', '?']).next().unwrap_or(""),
    );
    println!("reply {:?}, heard {heard:?}", first.reply);
    assert!(
        wer < 0.35,
        "agent said {:?}, whisper heard {heard:?}",
        first.reply
    );
}

/// A call's models stay loaded for the next call on the same agent: the second call loads
/// none, and hears the same words.
#[test]
fn a_second_call_takes_the_models_the_first_left() {
    let cache = ModelCache::from_env();
    let call = read_wav(cache.call("three_turns.wav").unwrap()).unwrap();
    let agent = VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap();
    let answer = || {
        agent
            .answer_recording(&call, Pacing::Fast, SPEECH_RATE, &mut Quiet)
            .unwrap()
    };
    assert_eq!(agent.idle_models(), IdleModels::default());
    let first = answer();
    // One voice, one detector, and the replier's and the early transcript's Whisper.
    let left = IdleModels {
        voices: 1,
        detectors: 1,
        transcribers: 2,
    };
    assert_eq!(agent.idle_models(), left);
    let second = answer();
    assert_eq!(agent.idle_models(), left, "the second call loaded none");
    let heard = |outcome: &sublet_agent::CallOutcome| {
        outcome
            .turns
            .iter()
            .map(|t| t.transcript.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(heard(&first).len(), 3);
    assert_eq!(heard(&second), heard(&first));
}

#[test]
fn a_persona_greets_a_live_caller_and_still_answers_the_turn() {
    let cache = ModelCache::from_env();
    let dir = std::env::temp_dir().join(format!("sublet-greeting-{}", std::process::id()));
    // Five seconds of quiet for the greeting, then the question, then quiet for the reply.
    let call = question_between_quiet(&cache, &dir, 5.0, 5.0);
    let persona = Persona::parse(
        "instructions = \"You answer the phone for a weather line. Be brief.\"\n\
         greeting = \"Hello, thank you for calling. How can I help?\"",
    )
    .unwrap();
    let agent = VoiceAgent::load(cache.clone(), persona.apply(AgentConfig::default())).unwrap();
    let outcome = agent
        .answer_recording(&call, Pacing::Realtime, SPEECH_RATE, &mut Quiet)
        .unwrap();
    println!("{}", sublet_agent::turn_table(&outcome.turns));
    assert_eq!(outcome.turns.len(), 1, "{:#?}", outcome.turns);
    let reply = &outcome.reply.audio.samples;
    let rate = SPEECH_RATE as f64;
    let greeting = &reply[..(4.5 * rate) as usize];
    let mut stt = Transcriber::load(&cache).unwrap();
    let heard = stt.transcribe(greeting).unwrap();
    let wer = word_error_rate("Hello, thank you for calling. How can I help?", &heard);
    assert!(wer < 0.35, "the call opened with {heard:?}");
    let turn = &outcome.turns[0];
    assert!(
        turn.first_audio_s > 5.0 && !turn.reply.is_empty(),
        "{turn:?}"
    );
}

#[test]
fn make_room_ends_a_turns_hold_at_its_first_sentence() {
    // The agent tells the engine when a reply's first sentence is out (`Responder`), so
    // that make-room stops holding agents back for that turn before its token window ends.
    let engine = make_room_engine(PolicyConfig {
        switches: Switches::all(),
        window_tokens: 1_000,
        release_at_first_sentence: true,
        ..PolicyConfig::default()
    });
    let turn = |session| ChatRequest {
        priority: VOICE_PRIORITY,
        session: Some(session),
        ..ChatRequest::new(vec![Message::new(Role::User, "Tell me about the sea.")], 40)
    };
    let releases = || engine.scheduler_state().counters.first_sentence_releases;
    let mut stream = engine.chat(turn(7)).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            stream.next_blocking(),
            Some(Ok(StreamEvent::Text(_)))
        ));
    }
    // Another call's sentence is not this turn's.
    engine.call_line(8).first_sentence_out();
    assert!(matches!(
        stream.next_blocking(),
        Some(Ok(StreamEvent::Text(_)))
    ));
    assert_eq!(releases(), 0);
    engine.call_line(7).first_sentence_out();
    for _ in 0..3 {
        assert!(matches!(
            stream.next_blocking(),
            Some(Ok(StreamEvent::Text(_)))
        ));
    }
    assert_eq!(releases(), 1);
    drop(stream);
    // The call's next turn starts with its hold in place: a release after it ends does nothing.
    let (text, _) = engine.chat(turn(7)).unwrap().collect_blocking().unwrap();
    engine.call_line(7).first_sentence_out();
    let _ = engine.chat(turn(9)).unwrap().collect_blocking().unwrap();
    println!("{text:?} {:?}", engine.scheduler_state().counters);
    assert_eq!(releases(), 1);
}

/// The bundled model under make-room's scheduler, whose counters show what each step did.
fn make_room_engine(policy: PolicyConfig) -> Arc<Engine> {
    let cache = ModelCache::from_env();
    Arc::new(
        Engine::load(&EngineConfig {
            make_room: Some(policy),
            ..EngineConfig::from_cache(&cache).unwrap()
        })
        .unwrap(),
    )
}

#[test]
fn a_prompt_cached_whole_computes_only_its_last_token() {
    // mistral.rs's prefix cache reused nothing of a prompt it held whole (patch 3).
    let engine = make_room_engine(PolicyConfig::default());
    let prefilled = || engine.scheduler_state().counters.prefill_tokens;
    let request = ChatRequest::new(vec![Message::new(Role::User, "Name a colour.")], 4);
    let mut computed = Vec::new();
    for _ in 0..2 {
        let before = prefilled();
        let (text, finish) = engine
            .chat(request.clone())
            .unwrap()
            .collect_blocking()
            .unwrap();
        println!("{text:?} {finish:?}");
        computed.push(prefilled() - before);
    }
    assert!(
        computed[0] > 5 && computed[1] == 1,
        "prompt tokens computed: {computed:?}"
    );
}

#[test]
fn the_prefix_cache_keeps_no_more_tokens_than_the_kv_budget() {
    // A finished sequence's KV stays in mistral.rs's prefix cache, each holding at least
    // 512 tokens of room; make-room bounds the cache by its KV budget (patch 18). With a
    // budget of 600 tokens a second prompt evicts the first, which then computes again;
    // with the default budget the first is still there.
    let prompt_computed_again = |kv_budget_tokens| {
        let engine = make_room_engine(PolicyConfig {
            kv_budget_tokens,
            ..PolicyConfig::default()
        });
        let prefilled = || engine.scheduler_state().counters.prefill_tokens;
        let ask = |text: &str| {
            let request = ChatRequest::new(vec![Message::new(Role::User, text)], 4);
            let before = prefilled();
            engine.chat(request).unwrap().collect_blocking().unwrap();
            prefilled() - before
        };
        ask("Name a colour.");
        ask("Which planet is the largest in our solar system?");
        ask("Name a colour.")
    };
    let (small, default) = (
        prompt_computed_again(600),
        prompt_computed_again(PolicyConfig::default().kv_budget_tokens),
    );
    assert!(
        small > 5 && default == 1,
        "tokens computed again: {small} (a 600-token budget), {default} (the default)"
    );
}

#[test]
fn the_engine_streams_and_cancels() {
    let cache = ModelCache::from_env();
    let engine = Arc::new(Engine::load(&EngineConfig::from_cache(&cache).unwrap()).unwrap());
    let request = |max_tokens| {
        ChatRequest::new(
            vec![Message::new(Role::User, "What is the capital of France?")],
            max_tokens,
        )
    };
    let (text, finish) = engine
        .chat(request(24))
        .unwrap()
        .collect_blocking()
        .unwrap();
    println!("{text:?} {finish:?}");
    assert!(text.contains("Paris"), "{text:?}");
    assert!(finish.completion_tokens > 0 && finish.completion_tokens <= 24);

    // Dropping a stream mid-reply cancels it; the engine keeps serving.
    let mut long = engine.chat(request(400)).unwrap();
    let mut pieces = 0;
    while let Some(Ok(StreamEvent::Text(_))) = long.next_blocking() {
        pieces += 1;
        if pieces == 3 {
            break;
        }
    }
    drop(long);
    // A turn hint runs on its own in the background; the engine keeps serving.
    engine
        .call_line(7)
        .turn_hint(vec![Message::new(Role::System, "You are on a call.")])
        .unwrap();
    let (again, _) = engine.chat(request(8)).unwrap().collect_blocking().unwrap();
    assert!(!again.is_empty());
}
