//! A reply format's schema compiled before the engine's thread sees it (`GrammarCheck`):
//! refused with why when llguidance cannot compile it or when it costs more CPU than its
//! budget, on the bundled model's tokenizer.

use std::time::Duration;

use serde_json::json;
use sublet_engine::{
    ChatRequest, Engine, EngineConfig, GrammarRefused, Message, ReplyFormat, Role, GRAMMAR_BUDGET,
};
use sublet_models::ModelCache;

/// A schema at the server's 64 KiB bound that takes ~100 ms of CPU to compile here: 150
/// alternatives of six patterned strings each.
fn costly_schema() -> serde_json::Value {
    let alternatives: Vec<serde_json::Value> = (0..150)
        .map(|i| {
            let properties: serde_json::Map<String, serde_json::Value> = (0..6)
                .map(|j| {
                    let pattern = format!("^[a-z]{{1,{}}}[0-9]{{{j},{}}}$", i + 2, j + 40);
                    (
                        format!("k{j}"),
                        json!({"type": "string", "pattern": pattern}),
                    )
                })
                .collect();
            json!({"type": "object", "properties": properties})
        })
        .collect();
    json!({ "anyOf": alternatives })
}

#[test]
fn schemas_are_compiled_before_the_engine_and_refused_with_why() {
    let cache = ModelCache::from_env();
    let engine = Engine::load(&EngineConfig::from_cache(&cache).unwrap()).unwrap();
    let grammar = engine
        .grammar_check()
        .expect("the bundled model's tokenizer builds grammars");
    let plain = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    });
    let took = grammar.check(&plain).unwrap();
    assert!(took < GRAMMAR_BUDGET, "{took:?}");
    // Handed to the engine compiled, the schema holds the reply as one compiled there did.
    for format in [
        ReplyFormat::Compiled(grammar.compile(&plain).unwrap()),
        ReplyFormat::JsonSchema(plain.clone()),
    ] {
        let ask = vec![Message::new(Role::User, "Name a city in France, as JSON.")];
        let request = ChatRequest {
            format: format.clone(),
            ..ChatRequest::new(ask, 32)
        };
        let (reply, _) = engine.chat(request).unwrap().collect_blocking().unwrap();
        let value: serde_json::Value = serde_json::from_str(&reply)
            .unwrap_or_else(|e| panic!("{format:?}: {reply:?} is not JSON: {e}"));
        assert!(value["city"].is_string(), "{format:?}: {reply}");
    }

    let misspelt = json!({"type": "strin"});
    assert!(
        matches!(grammar.check(&misspelt), Err(GrammarRefused::Invalid(why)) if why.contains("strin")),
    );

    let costly = costly_schema();
    assert!(
        costly.to_string().len() < 64 << 10,
        "under the server's size bound"
    );
    // Timed apart from the budget: many times the plain schema's cost.
    let refused = grammar.compile_within(&costly, Duration::from_millis(10));
    let Err(GrammarRefused::TooCostly(costly_took)) = refused else {
        panic!("{refused:?}");
    };
    println!("plain schema {took:?}, costly schema {costly_took:?} of CPU");
    assert!(costly_took > took * 5, "{costly_took:?} against {took:?}");
}
