//! make-room on the real engine: the probes' two cases (a voice turn when agents hold the
//! whole KV budget, and while an agent prefill is in flight), switches off and on. Each
//! case fails by itself if its condition did not hold when the turn was sent; these tests
//! check what the scheduler did, from its own state, not how fast it was (the timings and
//! their ratios are `cargo xtask probe`'s to print). Also: sequences of different lengths
//! decoded in one pass, and prompt chunks and decodes in one mixed pass, give each the
//! tokens it gets alone, and a call's turn outlives the
//! agents' contexts in the prefix cache with call retention, and a turn whose reader left
//! mid-reply leaves its KV to the next.

use std::sync::Arc;

use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::probe::{self, ProbeOptions};
use sublet_engine::{
    ChatRequest, Engine, EngineConfig, Message, Prompt, Role, StreamEvent, VOICE_PRIORITY,
};
use sublet_models::ModelCache;

#[test]
fn make_room_takes_kv_and_steps_from_agents_for_a_voice_turn() {
    let cache = ModelCache::from_env();
    let options = ProbeOptions::default();
    let report = probe::run(
        &EngineConfig::from_cache(&cache).unwrap(),
        &options,
        |line| eprintln!("{line}"),
    )
    .unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());

    // KV full: with make-room the turn preempts agents; without, it waits while they run.
    let kv = &report.kv_full;
    assert!(kv.on.kv_preemptions() >= 1, "{:?}", kv.on.after.counters);
    assert_eq!(kv.off.kv_preemptions(), 0);
    assert!(
        kv.off.agent_tokens > kv.on.agent_tokens,
        "agents made {} tokens during the turn off, {} on",
        kv.off.agent_tokens,
        kv.on.agent_tokens
    );

    // Prefill in flight: with make-room the turn's first token comes while the agent's
    // prompt is still being computed; without, only after it.
    let prefill = &report.prefill_in_flight;
    assert!(
        prefill.on.agent_prefills_at_first_token() > 0,
        "{:?}",
        prefill.on.at_first_token
    );
    assert_eq!(
        prefill.off.agent_prefills_at_first_token(),
        0,
        "{:?}",
        prefill.off.at_first_token
    );
    assert!(
        prefill.on.after.counters.held_request_steps
            > prefill.on.at_arrival.counters.held_request_steps
    );

    // The voice turn's reply is the same text whatever the agents do: 17 tokens measured,
    // greedy, each turn's words as the turn's alone.
    assert!(!report.alone.text.trim().is_empty());
    for turn in [&report.alone, &kv.off, &kv.on, &prefill.off, &prefill.on] {
        assert_eq!(turn.gaps_ms.len(), probe::GAPS);
        assert_eq!(turn.text, report.alone.text);
    }
}

#[test]
fn sequences_of_different_lengths_decode_in_one_pass_as_each_alone() {
    // mistral.rs batches only equal KV lengths on CPU; patch 5 and the adapter decode
    // every step's sequences in one pass, each attending over its own cache.
    let cache = ModelCache::from_env();
    let engine = Arc::new(
        Engine::load(&EngineConfig {
            make_room: Some(PolicyConfig::default()),
            ..EngineConfig::from_cache(&cache).unwrap()
        })
        .unwrap(),
    );
    let prompts = [
        "What is the capital of France?",
        "Name three colours of the rainbow, then say why the sky looks blue in the day.",
        "Write one sentence about a cat that sleeps on a warm windowsill in the afternoon sun, \
         and one about the dog that watches it from the garden below.",
    ];
    let alone: Vec<String> = prompts.iter().map(|p| reply(&engine, p)).collect();
    let before = engine.scheduler_state();
    assert_eq!(before.unequal_decode_passes, 0, "one at a time: {before:?}");

    let together: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (engine, prompt) = (engine.clone(), p.to_string());
            std::thread::spawn(move || reply(&engine, &prompt))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let after = engine.scheduler_state();
    println!("{alone:#?}\n{together:#?}\n{after:?}");
    assert!(
        after.unequal_decode_passes > 0,
        "no pass decoded unequal lengths: {after:?}"
    );
    assert!(
        after.decoded_sequences - before.decoded_sequences
            > after.decode_passes - before.decode_passes
    );
    assert_eq!(together, alone);
}

#[test]
fn prompt_chunks_and_decodes_in_one_mixed_pass_give_each_its_tokens_alone() {
    // Patch 24 and the adapter's `Batching::Mixed`: a step's decodes run inside its
    // prompt chunk's pass. With 16-token chunks, the later requests' prompts are computed
    // while the earlier ones decode, in passes of both. Two engines, so that the second
    // finds none of the prompts in its prefix cache.
    let cache = ModelCache::from_env();
    let load = || {
        Arc::new(
            Engine::load(&EngineConfig {
                make_room: Some(PolicyConfig {
                    chunk_tokens: Some(16),
                    ..PolicyConfig::default()
                }),
                mixed_passes: true,
                ..EngineConfig::from_cache(&cache).unwrap()
            })
            .unwrap(),
        )
    };
    let prompts = [
        "Count from one to ten, in words.",
        "Name three colours of the rainbow, then say why the sky looks blue in the day.",
        "Write one sentence about a cat that sleeps on a warm windowsill in the afternoon sun, \
         and one about the dog that watches it from the garden below.",
    ];
    let one_at_a_time = load();
    let alone: Vec<String> = prompts.iter().map(|p| reply(&one_at_a_time, p)).collect();
    let alone_state = one_at_a_time.scheduler_state();
    assert_eq!(
        alone_state.mixed_passes, 0,
        "one at a time: {alone_state:?}"
    );

    let engine = load();
    let together: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (engine, prompt) = (engine.clone(), p.to_string());
            // Each arrives while the one before decodes.
            std::thread::sleep(std::time::Duration::from_millis(150));
            std::thread::spawn(move || reply(&engine, &prompt))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let after = engine.scheduler_state();
    println!("{alone:#?}\n{together:#?}\n{after:?}");
    assert!(after.mixed_passes >= 2, "too few mixed passes: {after:?}");
    assert_eq!(together, alone);
}

/// A greedy reply of 24 tokens to one user message.
fn reply(engine: &Engine, prompt: &str) -> String {
    let request = ChatRequest::new(vec![Message::new(Role::User, prompt)], 24);
    let (text, finish) = engine.chat(request).unwrap().collect_blocking().unwrap();
    assert!(finish.completion_tokens > 4, "{text:?} {finish:?}");
    text
}

#[test]
fn a_request_dropped_while_it_waits_computes_nothing() {
    // One request runs at a time, so the second waits; its client goes away meanwhile.
    let cache = ModelCache::from_env();
    let engine = Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig::default()),
        max_running: 1,
        ..EngineConfig::from_cache(&cache).unwrap()
    })
    .unwrap();
    let ask = |prompt: &str, tokens: usize| {
        engine
            .chat(ChatRequest::new(
                vec![Message::new(Role::User, prompt)],
                tokens,
            ))
            .unwrap()
    };
    let dropped_prompt =
        "Name five rivers of Europe and the seas they flow into, with one fact about each.";
    let dropped_tokens = engine
        .prompt_tokens(&Prompt::Chat(vec![Message::new(
            Role::User,
            dropped_prompt,
        )]))
        .unwrap();
    let before = engine.scheduler_state();
    let mut running = ask("Tell me a long story about a lighthouse keeper.", 48);
    assert!(running.next_blocking().is_some(), "the first request runs");
    let waiting = ask(dropped_prompt, 16);
    let started = std::time::Instant::now();
    while engine.scheduler_state().waiting == 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the second request never waited: {:?}",
            engine.scheduler_state()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(waiting);
    let (_, finish) = running.collect_blocking().unwrap();
    // Time for the dropped request to have been admitted and prefilled, had it stayed.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let after = engine.scheduler_state();
    println!("{finish:?}\n{after:?}");
    assert_eq!((after.waiting, after.running), (0, 0), "{after:?}");
    // The first request's prompt, not the dropped one's too (a CI run once counted one
    // token more than the first's 40: not the dropped prompt's 49).
    let prefilled = after.counters.prefill_tokens - before.counters.prefill_tokens;
    assert!(
        prefilled < (finish.prompt_tokens + dropped_tokens) as u64,
        "{prefilled} prompt tokens computed: the first request's {} and the dropped one's {}",
        finish.prompt_tokens,
        dropped_tokens
    );
}

#[test]
fn with_call_retention_a_calls_turn_outlives_agents_contexts_in_the_prefix_cache() {
    // The prefix cache keeps at most the KV budget's tokens. Agents' contexts finishing
    // after a call's turn push the turn out, oldest first, unless call retention has the
    // agents' entries go first: then the call's next turn finds its whole conversation.
    let cache = ModelCache::from_env();
    let engine = Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig {
            kv_budget_tokens: 1024,
            // A turn keeps its rank in the cache for `retain_ms`: ten minutes, not 30 s,
            // so that a machine slowed by the other tests in parallel does not outlast it.
            retain_ms: 600_000,
            ..PolicyConfig::default()
        }),
        ..EngineConfig::from_cache(&cache).unwrap()
    })
    .unwrap();
    let words = |seed: usize, n: usize| -> String {
        let pool = [
            "river", "stone", "lamp", "cloud", "garden", "window", "copper", "field",
        ];
        (0..n)
            .map(|i| pool[(i * 7 + seed * 3 + i / 5) % pool.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut cached_share = Vec::new();
    for (call, retention) in [(1u64, false), (2, true)] {
        // New switches take effect at a request that finds the scheduler idle: the last
        // reply's stream can end before its request leaves the scheduler, and a turn sent
        // then ran the whole call under the switches before (a flaky failure).
        wait_until_idle(&engine);
        engine.set_make_room_switches(Switches {
            call_retention: retention,
            ..Switches::all()
        });
        let turn = |messages: Vec<Message>| {
            let request = ChatRequest {
                priority: VOICE_PRIORITY,
                session: Some(call),
                ..ChatRequest::new(messages, 8)
            };
            engine.chat(request).unwrap().collect_blocking().unwrap().0
        };
        let mut messages = vec![
            Message::new(
                Role::System,
                format!("Call {call}. You are a helpful voice agent."),
            ),
            Message::new(Role::User, "What is the capital of France?"),
        ];
        let reply = turn(messages.clone());
        // Three agents' contexts of ~400 tokens each, finished after the turn.
        for agent in 0..3 {
            let prompt = format!("Agent {call}.{agent}. {}", words(agent, 300));
            let request = ChatRequest::new(vec![Message::new(Role::User, prompt)], 2);
            engine.chat(request).unwrap().collect_blocking().unwrap();
        }
        messages.push(Message::new(Role::Assistant, reply));
        messages.push(Message::new(Role::User, "And of Spain?"));
        let before = engine.scheduler_state().counters;
        turn(messages);
        let after = engine.scheduler_state().counters;
        let prompt = after.turn_prompt_tokens - before.turn_prompt_tokens;
        let cached = after.turn_cached_tokens - before.turn_cached_tokens;
        println!(
            "call retention {retention}: {cached} of the turn's {prompt} prompt tokens cached"
        );
        cached_share.push(cached as f64 / prompt.max(1) as f64);
    }
    assert!(
        cached_share[0] < 0.3 && cached_share[1] > 0.7,
        "the second turn's prompt cached, without and with call retention: {cached_share:?}"
    );
}

#[test]
fn a_turn_whose_reader_left_mid_reply_leaves_its_kv_to_the_next_turn() {
    // The voice agent stops reading a reply once it has the sentences it speaks, which
    // cancels the request. The KV of its prompt and of the reply so far still serves the
    // call's next turn, which repeats them: without it, that turn computed its whole
    // history again.
    let cache = ModelCache::from_env();
    let engine = Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig::default()),
        ..EngineConfig::from_cache(&cache).unwrap()
    })
    .unwrap();
    let turn = |messages: Vec<Message>| {
        let request = ChatRequest {
            priority: VOICE_PRIORITY,
            session: Some(5),
            ..ChatRequest::new(messages, 48)
        };
        engine.chat(request).unwrap()
    };
    let mut messages = vec![
        Message::new(Role::System, "You are a helpful voice agent on a call."),
        Message::new(
            Role::User,
            "Tell me about the history of Paris, the river Seine and its bridges.",
        ),
    ];
    let first_prompt = engine
        .prompt_tokens(&Prompt::Chat(messages.clone()))
        .unwrap();
    let mut reply = turn(messages.clone());
    let mut heard = String::new();
    while heard.split_whitespace().count() < 4 {
        match reply.next_blocking() {
            Some(Ok(StreamEvent::Text(text))) => heard.push_str(&text),
            other => panic!("the reply ended after {heard:?}: {other:?}"),
        }
    }
    drop(reply);
    wait_until_idle(&engine);
    messages.push(Message::new(Role::Assistant, heard.trim()));
    messages.push(Message::new(Role::User, "And the Louvre?"));
    let before = engine.scheduler_state().counters;
    turn(messages).collect_blocking().unwrap();
    let after = engine.scheduler_state().counters;
    let prompt = after.turn_prompt_tokens - before.turn_prompt_tokens;
    let cached = after.turn_cached_tokens - before.turn_cached_tokens;
    println!("after {heard:?}: {cached} of the next turn's {prompt} prompt tokens cached");
    assert!(
        cached as usize >= first_prompt,
        "{cached} of {prompt} cached: not even the first turn's {first_prompt}"
    );
}

#[test]
fn an_agents_prompt_serves_no_call_from_the_prefix_cache_but_a_calls_serves_calls() {
    // One engine serves calls and the API. A client that times its requests must not learn
    // whether a call's prompt (the persona, a caller's words) is cached, so the prefix
    // cache serves each kind only its own kind's prompts (mistral.rs patch 26); calls still
    // share theirs, the persona first of all.
    let cache = ModelCache::from_env();
    let engine = Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig::default()),
        ..EngineConfig::from_cache(&cache).unwrap()
    })
    .unwrap();
    let messages = vec![
        Message::new(
            Role::System,
            "You are the voice agent of the Harbour Hotel. Keep replies short and kind.",
        ),
        Message::new(
            Role::User,
            "I would like to book a double room for two nights from the fourth of May.",
        ),
    ];
    let prompt = engine
        .prompt_tokens(&Prompt::Chat(messages.clone()))
        .unwrap();
    // An agent's request with the very prompt a call is about to send.
    let request = ChatRequest::new(messages.clone(), 2);
    engine.chat(request).unwrap().collect_blocking().unwrap();
    wait_until_idle(&engine);
    let turn_cached = |call: u64| {
        let before = engine.scheduler_state().counters;
        let request = ChatRequest {
            priority: VOICE_PRIORITY,
            session: Some(call),
            ..ChatRequest::new(messages.clone(), 2)
        };
        engine.chat(request).unwrap().collect_blocking().unwrap();
        wait_until_idle(&engine);
        let after = engine.scheduler_state().counters;
        after.turn_cached_tokens - before.turn_cached_tokens
    };
    assert_eq!(turn_cached(11), 0, "the agent's prompt served a call");
    let cached = turn_cached(12) as usize;
    assert!(
        cached + 1 >= prompt,
        "another call found {cached} of the first call's {prompt} prompt tokens"
    );
}

/// Waits (at most 10 s) until the scheduler holds no request: a reply's stream can end
/// before its request leaves the scheduler.
fn wait_until_idle(engine: &Engine) {
    let started = std::time::Instant::now();
    while {
        let state = engine.scheduler_state();
        state.running + state.waiting > 0
    } {
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
