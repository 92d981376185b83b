//! A reply format's grammar compiled before the engine sees it, on the caller's (blocking)
//! thread, and handed to the engine compiled: the engine's one thread, which every reply,
//! a caller's among them, waits on, compiles nothing. A JSON schema llguidance refuses is
//! refused there, and one whose compilation takes more than [`GRAMMAR_BUDGET`] of CPU
//! too, so that no client holds a blocking worker long either.
//!
//! llguidance builds its lexer lazily, under its default limits (lexer fuel, grammar size),
//! so nearly every schema compiles in a few milliseconds; the budget is for the rest. It
//! counts the thread's CPU time, not the wall clock, so that a busy machine does not turn
//! an ordinary schema away.

use std::sync::Arc;
use std::time::Duration;

use mistralrs_core::llguidance::{api::TopLevelGrammar, ParserFactory};
use mistralrs_core::CompiledGrammar;

/// Most CPU a schema's compilation may take.
pub const GRAMMAR_BUDGET: Duration = Duration::from_millis(100);

/// Compiles reply formats as the engine does.
#[derive(Clone)]
pub struct GrammarCheck {
    factory: Arc<ParserFactory>,
}

/// Why a schema is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrammarRefused {
    /// llguidance does not take it (its message).
    Invalid(String),
    /// It took this much CPU to compile, more than its budget.
    TooCostly(Duration),
}

impl std::fmt::Display for GrammarRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrammarRefused::Invalid(why) => write!(f, "the schema cannot be compiled: {why}"),
            GrammarRefused::TooCostly(took) => write!(
                f,
                "the schema took {} ms of CPU to compile, over the most a schema may take",
                took.as_millis(),
            ),
        }
    }
}

impl GrammarCheck {
    pub(crate) fn new(factory: Arc<ParserFactory>) -> Self {
        Self { factory }
    }

    /// Compiles `schema` on this thread as the engine would: the CPU it took, or why it is
    /// refused.
    pub fn check(&self, schema: &serde_json::Value) -> Result<Duration, GrammarRefused> {
        self.compile_within(schema, GRAMMAR_BUDGET)
            .map(|(_, took)| took)
    }

    /// Compiles `schema` on this thread within [`GRAMMAR_BUDGET`], for the engine to take
    /// as it is (`ReplyFormat::Compiled`): its thread then compiles nothing.
    pub fn compile(&self, schema: &serde_json::Value) -> Result<CompiledSchema, GrammarRefused> {
        self.compile_within(schema, GRAMMAR_BUDGET)
            .map(|(compiled, _)| compiled)
    }

    /// [`GrammarCheck::compile`] with a budget of `budget`, and the CPU it took.
    pub fn compile_within(
        &self,
        schema: &serde_json::Value,
        budget: Duration,
    ) -> Result<(CompiledSchema, Duration), GrammarRefused> {
        let started = thread_cpu_time();
        let grammar = TopLevelGrammar::from_json_schema(schema.clone());
        let parser = self.factory.create_parser(grammar);
        let took = thread_cpu_time().saturating_sub(started);
        match parser {
            Err(e) => Err(GrammarRefused::Invalid(e.to_string())),
            Ok(_) if took > budget => Err(GrammarRefused::TooCostly(took)),
            Ok(parser) => Ok((
                CompiledSchema {
                    schema: schema.clone(),
                    grammar: CompiledGrammar::new(parser),
                },
                took,
            )),
        }
    }
}

/// A JSON Schema with its grammar compiled: the engine gives each sequence a copy of its
/// parser. Equal to another of the same schema.
#[derive(Clone)]
pub struct CompiledSchema {
    schema: serde_json::Value,
    pub(crate) grammar: CompiledGrammar,
}

impl CompiledSchema {
    pub fn schema(&self) -> &serde_json::Value {
        &self.schema
    }
}

impl PartialEq for CompiledSchema {
    fn eq(&self, other: &Self) -> bool {
        self.schema == other.schema
    }
}

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CompiledSchema").field(&self.schema).finish()
    }
}

impl std::fmt::Debug for GrammarCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCheck").finish_non_exhaustive()
    }
}

/// The CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; the clock exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(
        now.tv_sec.max(0) as u64,
        now.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}
