//! The agents' door: OpenAI's and Anthropic's HTTP APIs on the shared engine.
//!
//! OpenAI's `POST /v1/chat/completions` (streamed as server-sent events or whole; with
//! `tools`, the model's calls come back as OpenAI's `tool_calls`), `POST /v1/completions`
//! (a text continued as it stands) and `POST /v1/responses` (the Responses API: input
//! items, function calls, responses kept in memory for `previous_response_id`);
//! Anthropic's `POST /v1/messages` and `POST /v1/messages/count_tokens`; `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text, behind the key when one is set). All
//! of them are one engine request underneath ([`api`]). A request may carry `priority`
//! (lower is more urgent, as in vLLM) within the operator's range ([`Limits::priorities`]);
//! without one it runs at [`AGENT_PRIORITY`](sublet_engine::AGENT_PRIORITY). Every refusal is a
//! JSON error in its API's shape and touches nothing else in flight.
//!
//! What a client cannot push past: [`serve`]'s bound on connections and deadline for
//! headers; a deadline and a size bound for the body, which must be JSON (so a web page
//! cannot post to a keyless local server); without a key, only loopback `Host` names (so
//! a page that rebinds its name to 127.0.0.1 cannot use it); a bound on chat requests in
//! flight (429 with `Retry-After` beyond it), a place taken only once the body is in;
//! bounds on the fields that cost the engine work; the key compared in constant time.

mod anthropic;
pub mod api;
mod connections;
mod error;
mod host;
mod limits;
mod metrics;
pub mod openai;
mod prompt_length;
mod write_deadline;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use api::{Admitted, Api, Parsed};
pub use connections::{serve, ConnectionLimits};
pub use error::ApiError;
pub use host::name_of as host_name;
pub use limits::Limits;
pub use metrics::Metrics;
use sublet_engine::{Engine, EngineError, ReplyFormat, StreamEvent};

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Required as `Authorization: Bearer <key>` or `x-api-key: <key>` when set.
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes (default 4 MiB).
    pub max_body_bytes: usize,
    /// Time a client has to send its body once its headers are in (default 30 s).
    pub body_timeout: Duration,
    /// Completion requests (chat or text) in flight at once, waiting in the engine or
    /// running (default 64); beyond it a request gets 429 with `Retry-After`.
    pub max_in_flight: usize,
    pub limits: Limits,
    /// More lines for `/metrics` from the process around the engine (default none).
    pub more_metrics: Option<MoreMetrics>,
    /// Host names a server without a key answers to beside the loopback ones (default
    /// none): a web page that rebinds its own name to 127.0.0.1 sends that name as `Host`
    /// and is refused. With a key any `Host` is served (the key is the guard).
    pub allowed_hosts: Vec<String>,
}

/// Lines of Prometheus' text format that the process around the engine adds to
/// `/metrics` (the voice agent's speech models, say), rendered at each scrape.
#[derive(Clone)]
pub struct MoreMetrics(pub Arc<dyn Fn() -> String + Send + Sync>);

impl std::fmt::Debug for MoreMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoreMetrics")
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body_bytes: 4 << 20,
            body_timeout: Duration::from_secs(30),
            max_in_flight: 64,
            limits: Limits::default(),
            more_metrics: None,
            allowed_hosts: Vec::new(),
        }
    }
}

struct AppState {
    engine: Arc<Engine>,
    config: ServerConfig,
    metrics: Arc<Metrics>,
    in_flight: Arc<Semaphore>,
    /// `/metrics`' costly lines (the heap's figures, the process's own), sampled.
    memory_lines: sublet_engine::memory::Sampled<Arc<str>>,
    /// Responses kept for `previous_response_id`.
    kept: openai::responses::Kept,
}

/// The HTTP routes, ready for [`serve`].
pub fn router(engine: Arc<Engine>, config: ServerConfig, metrics: Arc<Metrics>) -> Router {
    let state = Arc::new(AppState {
        engine,
        in_flight: Arc::new(Semaphore::new(config.max_in_flight)),
        config,
        metrics,
        memory_lines: sublet_engine::memory::Sampled::new(sublet_engine::memory::SAMPLE_EVERY),
        kept: openai::responses::Kept::default(),
    });
    let door = |api: Api| {
        post(
            move |State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body| async move {
                answer(api, &state, &headers, body).await
            },
        )
    };
    Router::new()
        .route("/v1/chat/completions", door(Api::Chat))
        .route("/v1/completions", door(Api::Text))
        .route("/v1/responses", door(Api::Responses))
        .route("/v1/messages", door(Api::Messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics_text))
        .fallback(|| async {
            error_response(
                Api::Chat,
                &ApiError::new(404, "not_found_error", "no such route"),
            )
        })
        .with_state(state)
}

/// A refusal in `api`'s shape (OpenAI's for the routes that belong to no API).
fn error_response(api: Api, error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = (status, Json(api.error_body(error))).into_response();
    if let Some(seconds) = error.retry_after_s {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.config.api_key else {
        return host::check(headers, &state.config.allowed_hosts);
    };
    // OpenAI's clients send the key as a bearer token, Anthropic's as `x-api-key`.
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .or_else(|| headers.get("x-api-key").map(HeaderValue::as_bytes));
    // In constant time: how long a wrong key takes to refuse says nothing of the key.
    match given.is_some_and(|given| bool::from(given.ct_eq(key.as_bytes()))) {
        true => Ok(()),
        false => Err(ApiError::new(
            401,
            "authentication_error",
            "missing or wrong API key (send Authorization: Bearer <key>, or x-api-key: <key>)",
        )),
    }
}

/// Only JSON bodies: a browser page may post a form or text to a server on localhost
/// without asking first, but not JSON.
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    match essence.eq_ignore_ascii_case("application/json") {
        true => Ok(()),
        false => Err(ApiError::new(
            415,
            "invalid_request_error",
            format!("Content-Type must be application/json, not {content_type:?}"),
        )),
    }
}

/// The body, within the size bound and the deadline.
async fn read_body(config: &ServerConfig, body: Body) -> Result<Bytes, ApiError> {
    let limit = config.max_body_bytes;
    match tokio::time::timeout(config.body_timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(ApiError::new(
            413,
            "invalid_request_error",
            format!("cannot read the request body (at most {limit} bytes): {e}"),
        )),
        Err(_) => Err(ApiError::new(
            408,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s",
                config.body_timeout.as_secs()
            ),
        )),
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return error_response(Api::Chat, &e);
    }
    Json(json!({"object": "list", "data": [{
        "id": state.engine.model_name(), "object": "model", "created": 0, "owned_by": "sublet",
    }]}))
    .into_response()
}

/// Prometheus' text: the requests' and the scheduler's counters as they stand, the memory
/// figures as last sampled (at most a second old). Behind the key when one is set.
async fn metrics_text(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return error_response(Api::Chat, &e);
    }
    let memory = state.memory_lines.get(|| {
        let more = state.config.more_metrics.as_ref();
        let lines = metrics::render_memory(&state.engine.memory())
            + &more.map_or_else(String::new, |more| (more.0)());
        lines.into()
    });
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render()
            + &metrics::render_scheduler(&state.engine.scheduler_state())
            + &memory,
    )
        .into_response()
}

/// Anthropic's `count_tokens`: a Messages request's prompt in tokens, counted off the
/// engine's thread (see [`prompt_length::count`]).
async fn count_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let counted = async {
        authorize(&state, &headers)?;
        require_json(&headers)?;
        let body = read_body(&state.config, body).await?;
        let request = anthropic::counted_request(&body, &state.config.limits)?;
        let counter = state
            .engine
            .token_counter()
            .ok_or_else(|| ApiError::server("this engine cannot count tokens"))?;
        prompt_length::count(counter, &request).await
    };
    match counted.await {
        Ok(tokens) => Json(json!({"input_tokens": tokens})).into_response(),
        Err(error) => {
            state.metrics.refused(error.status);
            error_response(Api::Messages, &error)
        }
    }
}

async fn answer(api: Api, state: &Arc<AppState>, headers: &HeaderMap, body: Body) -> Response {
    match serve_request(api, state, headers, body).await {
        Ok(response) => response,
        Err(Unserved::Refused(error)) => {
            state.metrics.refused(error.status);
            error_response(api, &error)
        }
        Err(Unserved::Failed(error)) => error_response(api, &error),
    }
}

/// Why a request got an error answer: refused at the door, or failed once admitted (its
/// ending already counted).
enum Unserved {
    Refused(ApiError),
    Failed(ApiError),
}

impl From<ApiError> for Unserved {
    fn from(error: ApiError) -> Self {
        Unserved::Refused(error)
    }
}

async fn serve_request(
    api: Api,
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Unserved> {
    authorize(state, headers)?;
    require_json(headers)?;
    // The body first, the place among those in flight after: a client that sends its body
    // slowly holds a connection (bounded by `serve`), never a place.
    let body = read_body(&state.config, body).await?;
    let permit: OwnedSemaphorePermit =
        state.in_flight.clone().try_acquire_owned().map_err(|_| {
            ApiError::busy(format!(
                "this server is answering {} requests, its most at once; try again shortly",
                state.config.max_in_flight
            ))
        })?;
    let parsed = api.parse(&body, &state.config.limits, &state.kept);
    // Only the parsed request lives on while it is answered.
    drop(body);
    let Parsed {
        mut request,
        stream,
        mut answer,
    } = parsed?;
    if let (Some(counter), Some(max_len)) = (
        state.engine.token_counter(),
        state.engine.max_sequence_length(),
    ) {
        prompt_length::check(counter, max_len, &request, api.prompt_field()).await?;
    }
    // A schema is compiled here, on a blocking worker, never on the engine's thread.
    if let (ReplyFormat::JsonSchema(schema), Some(grammar)) =
        (&request.format, state.engine.grammar_check())
    {
        let (grammar, schema) = (grammar.clone(), schema.clone());
        let compiled = tokio::task::spawn_blocking(move || grammar.compile(&schema))
            .await
            .map_err(|e| ApiError::server(format!("compiling the schema: {e}")))?
            .map_err(|refused| ApiError::invalid(Some(api.format_field()), refused.to_string()))?;
        request.format = ReplyFormat::Compiled(compiled);
    }
    let priority = request.priority;
    // Admitted: from here the request ends counted once, even if its client leaves while
    // it waits for its first token.
    let mut ending = Ending {
        metrics: state.metrics.clone(),
        api,
        priority,
        ended: false,
        _permit: permit,
    };
    let admitted = Admitted {
        number: state.metrics.started(api, priority),
        created: now_s(),
        model: state.engine.model_name().to_string(),
    };
    let mut reply = match state.engine.chat_async(request).await {
        Ok(reply) => reply,
        Err(e) => {
            ending.failed();
            return Err(Unserved::Failed(ApiError::new(
                503,
                "server_error",
                e.to_string(),
            )));
        }
    };
    // The first event tells a refused request (e.g. a prompt over the model's length) from
    // one that runs, before any status is sent.
    let first = match reply.next().await {
        Some(Ok(event)) => event,
        failure => {
            ending.failed();
            return Err(Unserved::Failed(match failure {
                Some(Err(EngineError::InvalidRequest(message))) => {
                    ApiError::invalid(Some(api.prompt_field()), message)
                }
                Some(Err(e)) => ApiError::server(e.to_string()),
                _ => ApiError::server("the engine ended the request"),
            }));
        }
    };

    if !stream {
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut event: Option<Result<StreamEvent, EngineError>> = Some(Ok(first));
        loop {
            match event {
                Some(Ok(StreamEvent::Text(t))) => text.push_str(&t),
                Some(Ok(StreamEvent::ToolCalls(c))) => calls.extend(c),
                Some(Ok(StreamEvent::Done(finish))) => {
                    ending.finished(finish.prompt_tokens, finish.completion_tokens);
                    let whole = answer.whole(&admitted, text, calls, &finish);
                    return Ok(Json(whole).into_response());
                }
                Some(Err(e)) => {
                    ending.failed();
                    return Err(Unserved::Failed(ApiError::server(e.to_string())));
                }
                None => {
                    ending.failed();
                    return Err(Unserved::Failed(ApiError::server("reply ended early")));
                }
            }
            event = reply.next().await;
        }
    }

    // Streamed: the API's events for each of the engine's, then its end (OpenAI's chat:
    // `[DONE]`). The client going away drops this stream, and with it the request in the
    // engine.
    let mut pending = Some(first);
    let mut ready = std::collections::VecDeque::<Event>::new();
    let mut done = false;
    let events = futures::stream::poll_fn(
        move |cx| -> std::task::Poll<Option<Result<Event, Infallible>>> {
            use std::task::Poll;
            loop {
                if let Some(event) = ready.pop_front() {
                    return Poll::Ready(Some(Ok(event)));
                }
                if done {
                    return Poll::Ready(None);
                }
                let mut out = Vec::new();
                let event = match pending.take() {
                    Some(e) => e,
                    None => match reply.poll_next(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Some(Ok(e))) => e,
                        Poll::Ready(Some(Err(e))) => {
                            ending.failed();
                            done = true;
                            let error = ApiError::server(e.to_string());
                            ready.push_back(answer.failed(&admitted, &error));
                            continue;
                        }
                        Poll::Ready(None) => {
                            if !ending.ended {
                                ending.failed();
                            }
                            done = true;
                            answer.end(&mut out);
                            ready.extend(out);
                            continue;
                        }
                    },
                };
                if let StreamEvent::Done(finish) = &event {
                    ending.finished(finish.prompt_tokens, finish.completion_tokens);
                }
                answer.events(&admitted, event, &mut out);
                ready.extend(out);
            }
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// How an admitted request ended, counted once: finished, failed, or (dropped before
/// either, its client gone) cancelled. It holds the request's place among those in flight.
struct Ending {
    metrics: Arc<Metrics>,
    api: Api,
    priority: i32,
    ended: bool,
    _permit: OwnedSemaphorePermit,
}

impl Ending {
    fn finished(&mut self, prompt_tokens: usize, completion_tokens: usize) {
        self.ended = true;
        self.metrics
            .finished(self.api, self.priority, prompt_tokens, completion_tokens);
    }

    fn failed(&mut self) {
        self.ended = true;
        self.metrics.failed(self.api, self.priority);
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if !self.ended {
            self.metrics.cancelled(self.api, self.priority);
        }
    }
}
