//! Streaming /v1/responses: one chat choice's output, split by the chat output parsers, turned into
//! the Responses API's server-sent events in the order the official `openai` client's stream
//! accumulator expects: `response.created`, `response.in_progress`, then per output item
//! `output_item.added`, its content part, its deltas (`reasoning_text.delta`, `output_text.delta`,
//! `function_call_arguments.delta`), their `.done` events and `output_item.done`, and at the end
//! `response.completed` (or `response.incomplete` at the token limit, `response.failed` on an error)
//! carrying the whole `response` object, the one the non-streamed request answers.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::chat::StartedChat;
use crate::chat_output::{MessageDelta, StreamParser};
use crate::common::{account_choice, finish_error};
use crate::error::ApiError;
use crate::fields::Fields;
use crate::generation::{ChoiceEnd, ChoiceItem, ChoiceUsage, FinishKind};
use crate::response::{new_id, usage_json};
use crate::responses::{
    finish_response, function_call_item, message_item, output_text_part, reasoning_item,
    reasoning_part, response_object, ItemIds,
};
use crate::sse::sse_response;
use crate::state::AppState;

/// The SSE response for a started chat (one choice) asked for as `/v1/responses` with `stream: true`.
pub(crate) fn responses_stream(
    state: Arc<AppState>,
    started: StartedChat,
    f: &Fields,
    chat: &Value,
) -> Result<Response, ApiError> {
    let head = started.head;
    let response = response_object(
        f,
        chat,
        &new_id("resp"),
        &json!(head.created),
        &json!(head.model),
    );
    let (Some(run), Some(parsing)) = (started.runs.into_iter().next(), started.parsing.first())
    else {
        return Err(ApiError::internal("the request started no choice"));
    };
    let parser = parsing.stream();
    let mut writer = EventWriter {
        state,
        chat_id: head.id.clone(),
        ids: ItemIds::of_chat(&head.id),
        response,
        sequence: 0,
        events: String::new(),
        output: Vec::new(),
        open: None,
        calls: 0,
        parser,
        usage: ChoiceUsage {
            prompt_tokens: started.prompt_tokens,
            ..ChoiceUsage::default()
        },
    };
    let created = writer.response.clone();
    writer.event("response.created", json!({"response": created}));
    writer.event("response.in_progress", json!({"response": created}));
    let items: BoxStream<'static, ChoiceItem> = run.into_stream().boxed();
    let events = futures_util::stream::unfold(
        (writer, items, false),
        |(mut writer, mut items, mut ended)| async move {
            loop {
                if !writer.events.is_empty() {
                    let events = std::mem::take(&mut writer.events);
                    return Some((events, (writer, items, ended)));
                }
                if ended {
                    return None;
                }
                match items.next().await {
                    Some(ChoiceItem::Text { text, .. }) => {
                        let delta = writer.parser.push(&text);
                        writer.on_delta(delta);
                    }
                    Some(ChoiceItem::Finished(end)) => {
                        writer.on_end(&end);
                        ended = true;
                    }
                    None => {
                        // A run hands out `Finished` before it ends; this is the failure it would be.
                        writer.on_end(&ChoiceEnd {
                            finish: FinishKind::Error(
                                "the choice ended without finishing".to_string(),
                            ),
                            usage: ChoiceUsage::default(),
                            time_to_first_token: None,
                            e2e: Duration::ZERO,
                            degeneration: None,
                        });
                        ended = true;
                    }
                }
            }
        },
    );
    Ok(sse_response(events))
}

/// The output item being streamed.
enum OpenItem {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// Turns a choice's parsed output into Responses events, and keeps the finished items for the final
/// `response` object.
struct EventWriter {
    state: Arc<AppState>,
    chat_id: String,
    ids: ItemIds,
    /// The `response` object as sent in `response.created`; completed at the end.
    response: Value,
    sequence: u64,
    /// Events not yet sent.
    events: String,
    /// Finished output items.
    output: Vec<Value>,
    open: Option<OpenItem>,
    /// Function calls opened so far.
    calls: usize,
    parser: StreamParser,
    usage: ChoiceUsage,
}

impl EventWriter {
    /// Queues one event; `sequence_number` and `type` are added to `body`.
    fn event(&mut self, kind: &str, mut body: Value) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.events
            .push_str(&format!("event: {kind}\ndata: {body}\n\n"));
    }

    /// The output index of the open item (it is not in `output` until it is done).
    fn open_index(&self) -> usize {
        self.output.len()
    }

    fn on_delta(&mut self, delta: MessageDelta) {
        if !delta.reasoning.is_empty() {
            if !matches!(self.open, Some(OpenItem::Reasoning { .. })) {
                self.open_reasoning();
            }
            let index = self.open_index();
            if let Some(OpenItem::Reasoning { id, text }) = &mut self.open {
                text.push_str(&delta.reasoning);
                let body = json!({"item_id": id, "output_index": index, "content_index": 0,
                    "delta": delta.reasoning});
                self.event("response.reasoning_text.delta", body);
            }
        }
        if !delta.content.is_empty() {
            if !matches!(self.open, Some(OpenItem::Message { .. })) {
                self.open_message();
            }
            let index = self.open_index();
            if let Some(OpenItem::Message { id, text }) = &mut self.open {
                text.push_str(&delta.content);
                let body = json!({"item_id": id, "output_index": index, "content_index": 0,
                    "delta": delta.content, "logprobs": []});
                self.event("response.output_text.delta", body);
            }
        }
        for chunk in delta.tool_calls {
            if let Some(call_id) = &chunk.id {
                self.open_call(call_id, chunk.name.as_deref().unwrap_or(""));
            }
            if chunk.arguments.is_empty() {
                continue;
            }
            let index = self.open_index();
            if let Some(OpenItem::Call { id, arguments, .. }) = &mut self.open {
                arguments.push_str(&chunk.arguments);
                let body = json!({"item_id": id, "output_index": index, "delta": chunk.arguments});
                self.event("response.function_call_arguments.delta", body);
            }
        }
    }

    fn open_reasoning(&mut self) {
        self.close();
        let id = self.ids.reasoning();
        let item = reasoning_item(&id, "", "in_progress");
        self.announce_text_item(&id, item, reasoning_part(""));
        self.open = Some(OpenItem::Reasoning {
            id,
            text: String::new(),
        });
    }

    fn open_message(&mut self) {
        self.close();
        let id = self.ids.message();
        let item = message_item(&id, "", "in_progress");
        self.announce_text_item(&id, item, output_text_part(""));
        self.open = Some(OpenItem::Message {
            id,
            text: String::new(),
        });
    }

    /// The events that open a text item (reasoning or message): the item, still without content,
    /// then its one content part.
    fn announce_text_item(&mut self, id: &str, mut item: Value, part: Value) {
        let index = self.open_index();
        item["content"] = json!([]);
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
    }

    fn open_call(&mut self, call_id: &str, name: &str) {
        self.close();
        let id = self.ids.call(self.calls);
        self.calls += 1;
        let index = self.open_index();
        let item = function_call_item(&id, call_id, name, "", "in_progress");
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.open = Some(OpenItem::Call {
            id,
            call_id: call_id.to_string(),
            name: name.to_string(),
            arguments: String::new(),
        });
    }

    /// The events that finish a text item: `done_event` with the fields of `done` (its text), then
    /// the finished content part.
    fn finish_text_item(
        &mut self,
        id: &str,
        index: usize,
        done_event: &str,
        done: Value,
        part: Value,
    ) {
        let at = json!({"item_id": id, "output_index": index, "content_index": 0});
        let mut event = at.clone();
        if let (Some(event), Value::Object(fields)) = (event.as_object_mut(), done) {
            event.extend(fields);
        }
        self.event(done_event, event);
        let mut finished = at;
        finished["part"] = part;
        self.event("response.content_part.done", finished);
    }

    /// Finishes the open item: its `.done` events, and it joins the output.
    fn close(&mut self) {
        let index = self.open_index();
        let item = match self.open.take() {
            None => return,
            Some(OpenItem::Reasoning { id, text }) => {
                let done = json!({"text": text});
                let part = reasoning_part(&text);
                self.finish_text_item(&id, index, "response.reasoning_text.done", done, part);
                reasoning_item(&id, &text, "completed")
            }
            Some(OpenItem::Message { id, text }) => {
                let done = json!({"text": text, "logprobs": []});
                let part = output_text_part(&text);
                self.finish_text_item(&id, index, "response.output_text.done", done, part);
                message_item(&id, &text, "completed")
            }
            Some(OpenItem::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name,
                        "arguments": arguments}),
                );
                function_call_item(&id, &call_id, &name, &arguments, "completed")
            }
        };
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    /// The choice ended: the parsers' held-back text, the open item closed, and the final event.
    fn on_end(&mut self, end: &ChoiceEnd) {
        let delta = self.parser.finish();
        self.on_delta(delta);
        self.close();
        let finish_reason = if self.calls > 0 && end.finish == FinishKind::Stop {
            "tool_calls"
        } else {
            end.finish.as_str()
        };
        account_choice(&self.state, end, finish_reason, &self.chat_id, 0);
        self.usage.add(&end.usage);
        let mut response = self.response.clone();
        let output = std::mem::take(&mut self.output);
        let status = finish_response(
            &mut response,
            finish_reason,
            output,
            &usage_json(&self.usage),
        );
        if let Some(error) = finish_error(&end.finish) {
            response["error"] = json!({"code": error.code.unwrap_or("server_error"),
                "message": error.message});
        }
        let kind = match status {
            "incomplete" => "response.incomplete",
            "failed" => "response.failed",
            _ => "response.completed",
        };
        self.event(kind, json!({"response": response}));
    }
}
