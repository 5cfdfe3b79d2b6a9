//! The assistant endpoint: tool budgets against a slow catalog.

mod common;

use axum::Json;
use axum::routing::post;
use common::{MS, json_of, spawn_app, spawn_app_with};
use orders_service::config::Admission;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::metric_value;
use tokio::time::Instant;

async fn chat(
    app: &common::TestApp,
    message: &str,
    budget_ms: u64,
) -> (StatusCode, Value, std::time::Duration) {
    let started = Instant::now();
    let response = app
        .client
        .post(format!("{}/api/assistant/chat", app.base))
        .header("X-Request-Timeout-Ms", budget_ms)
        .json(&json!({ "message": message }))
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, json_of(response).await, started.elapsed())
}

fn tool_calls(app: &common::TestApp, tool: &str, outcome: &str) -> f64 {
    metric_value(
        &app.metrics(),
        "tool_calls_total",
        &format!(r#"tool_name="{tool}",outcome="{outcome}""#),
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn slow_tools_are_cut_at_800ms_the_turn_ends_at_2s_and_a_fourth_call_is_refused() {
    // Admission off: this is about the tool budgets alone. With it on, the third call,
    // with about 400 ms left against a catalog two cut calls put at 1600 ms, would be
    // refused at once (too short to learn anything as a probe) instead of running out
    // what is left of the turn.
    let mut settings = None;
    let app = spawn_app_with(|c| {
        c.catalog_admission = Admission::Off;
        settings = Some((
            c.assistant_turn_budget_ms,
            c.assistant_tool_budget_ms,
            c.deadline_reserve_ms,
        ));
    })
    .await;
    // The bounds come from the settings (2000 ms turn, 800 ms per tool): early by at
    // most the per-hop reserve and a little (the catalog may answer 504 first), late by
    // at most LATE on a loaded 2-core machine, and all far below the catalog's delay.
    let (turn, cap, reserve) = settings.unwrap();
    const EARLY: u64 = 20;
    const LATE: u64 = 250;
    app.slow_catalog(turn + 1000);
    let (status, answer, took) = chat(
        &app,
        "What do SKU-00001, SKU-00002, SKU-00003 and SKU-00004 cost?",
        turn,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(took < MS(turn + LATE), "the turn took {took:?}");
    let calls = answer["tool_calls"].as_array().unwrap();
    let outcomes: Vec<_> = calls
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["timeout", "timeout", "timeout", "refused"]);
    let first = calls[0]["elapsed_ms"].as_u64().unwrap();
    // Cut at its cap: by our own timer, or a few ms earlier by the catalog, which was
    // handed the cap minus the per-hop reserve and answers 504 when that runs out.
    assert!(
        (cap - reserve - EARLY..cap + LATE).contains(&first),
        "the first tool ran {first} ms (cap {cap} ms)"
    );
    let second = calls[1]["elapsed_ms"].as_u64().unwrap();
    let third = calls[2]["elapsed_ms"].as_u64().unwrap();
    // Two tools used most of the turn: the third gets what is left, not its own cap.
    let left = turn.saturating_sub(first + second);
    assert!(
        third < cap - reserve - EARLY && third <= left + LATE,
        "the third tool got only what was left of the turn ({left} ms), ran {third} ms"
    );
    assert!(
        (turn - reserve - 3 * EARLY..=turn + LATE).contains(&(first + second + third)),
        "the three tools spent the turn: {first} + {second} + {third} ms"
    );
    assert!(
        calls[3]["elapsed_ms"].as_u64().unwrap() < 5,
        "the refused call did not run"
    );
    assert_eq!(answer["partial"], true);
    assert_eq!(tool_calls(&app, "catalog_lookup", "timeout"), 3.0);
    assert_eq!(tool_calls(&app, "catalog_lookup", "refused"), 1.0);
    assert_eq!(
        app.catalog_budgets.lock().unwrap().len(),
        3,
        "the fourth never reached the catalog"
    );
    // Every catalog call received at most the per-tool cap as its budget, and the first,
    // with the whole cap to spend, nearly all of it: a cap set far below the budget fails.
    let budgets = app.catalog_budgets.lock().unwrap().clone();
    assert!(budgets.iter().all(|b| b.unwrap() <= cap), "{budgets:?}");
    assert!(budgets[0].unwrap() >= cap - reserve - EARLY, "{budgets:?}");
}

#[tokio::test]
async fn the_answer_keeps_the_partial_results_when_one_tool_times_out() {
    let app = spawn_app().await;
    app.slow_catalog(2000);
    let (status, answer, _) = chat(&app, "Price and stock of SKU-00042?", 2000).await;
    assert_eq!(status, StatusCode::OK);
    let calls = answer["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["tool"], "catalog_lookup");
    assert_eq!(calls[0]["outcome"], "timeout");
    assert_eq!(calls[1]["tool"], "inventory_check");
    assert_eq!(calls[1]["outcome"], "ok");
    assert!(calls[1]["result"]["available"].as_i64().unwrap() > 0);
    assert_eq!(answer["partial"], true);
    let text = answer["answer"].as_str().unwrap();
    assert!(
        text.contains("in stock") && text.contains("ran out of time"),
        "{text}"
    );
    assert_eq!(tool_calls(&app, "inventory_check", "ok"), 1.0);
}

#[tokio::test]
async fn a_fast_turn_answers_with_every_result() {
    let app = spawn_app().await;
    let (status, answer, _) = chat(&app, "How much is SKU-00042?", 1000).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["partial"], false);
    assert_eq!(answer["planner"], "rules");
    assert!(
        answer["answer"]
            .as_str()
            .unwrap()
            .starts_with("SKU-00042 (Quiet Headset 42) costs")
    );
}

#[tokio::test]
async fn a_turn_never_outlives_the_request() {
    let app = spawn_app().await;
    app.slow_catalog(2000);
    let (status, answer, took) = chat(&app, "Price of SKU-00001?", 300).await;
    assert_eq!(status, StatusCode::OK, "a partial answer, not a 504");
    assert!(took < MS(400), "took {took:?}");
    assert!(answer["turn_budget_ms"].as_u64().unwrap() < 300);
}

#[tokio::test]
async fn a_chat_without_a_message_is_a_422() {
    let app = spawn_app().await;
    for body in [
        json!({}),
        json!({"message": "   "}),
        json!({"message": "x".repeat(4001)}),
    ] {
        let response = app
            .client
            .post(format!("{}/api/assistant/chat", app.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
}

/// A fake of an OpenAI-compatible chat-completions API (no model can run here): it
/// answers every request with one `inventory_check` tool call, after `delay`.
async fn fake_llm(delay: std::time::Duration) -> (String, test_support::Running) {
    let reply = json!({"choices": [{"message": {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "inventory_check", "arguments": "{\"sku\":\"SKU-00009\"}"}}
    ]}}]});
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |Json(request): Json<Value>| {
            let reply = reply.clone();
            async move {
                assert_eq!(request["tools"].as_array().unwrap().len(), 2);
                tokio::time::sleep(delay).await;
                Json(reply)
            }
        }),
    );
    let (base, running) = common::serve(router).await;
    (format!("{base}/v1"), running)
}

#[tokio::test]
async fn the_openai_planner_plans_tool_calls_within_the_turn() {
    let (url, _llm) = fake_llm(MS(0)).await;
    let app = spawn_app_with(|c| c.assistant_llm_url = Some(url)).await;
    let (status, answer, _) = chat(&app, "anything", 1000).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["planner"], "openai");
    assert_eq!(answer["tool_calls"][0]["tool"], "inventory_check");
    assert_eq!(answer["tool_calls"][0]["outcome"], "ok");
}

#[tokio::test]
async fn a_slow_planner_is_bounded_by_the_turn() {
    let (url, _llm) = fake_llm(MS(3000)).await;
    let app = spawn_app_with(|c| c.assistant_llm_url = Some(url)).await;
    let (status, answer, took) = chat(&app, "anything", 500).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{answer}");
    assert_eq!(answer["stage"], "tool");
    assert!(took < MS(600), "took {took:?}");
}
