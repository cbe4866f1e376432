use super::*;
use crate::data::text::tokenizer::train_bpe;

fn msg(role: &str, content: &str) -> Message {
    Message {
        role: role.to_owned(),
        content: content.to_owned(),
    }
}

fn conversation() -> Vec<Message> {
    vec![
        msg("system", "Be brief."),
        msg("user", "Name a colour."),
        msg("assistant", "Blue."),
        msg("user", "Another?"),
        msg("assistant", "Red."),
    ]
}

fn chatml() -> ChatTemplate {
    ChatTemplate::new(CHATML, "chatml", "", "<|endoftext|>").unwrap()
}

#[test]
fn lines_hold_messages_or_prompt_and_completion() {
    let m = parse_line(r#"{"messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
    assert_eq!(m, vec![msg("user", "hi")]);
    let m = parse_line(r#"{"prompt": "2+2?", "completion": "4", "system": "Maths."}"#).unwrap();
    assert_eq!(
        m,
        vec![
            msg("system", "Maths."),
            msg("user", "2+2?"),
            msg("assistant", "4")
        ]
    );
    for (line, want) in [
        ("[1]", "is an array, not a JSON object"),
        (
            r#"{"text": "x"}"#,
            "neither `messages` nor `prompt` and `completion` (its fields: text)",
        ),
        (r#"{"messages": []}"#, "`messages` is empty"),
        (
            r#"{"messages": [{"role": "user"}]}"#,
            "messages[0] has no `content`",
        ),
        (
            r#"{"messages": [{"role": 3, "content": "x"}]}"#,
            "`messages[0].role` is a number",
        ),
        (
            r#"{"prompt": "a", "completion": 4}"#,
            "`completion` is a number",
        ),
        ("{", "is not valid JSON"),
    ] {
        let e = parse_line(line).unwrap_err();
        assert!(e.contains(want), "{line}: {e}");
    }
}

#[test]
fn files_are_read_with_errors_naming_file_and_line() {
    let dir = std::env::temp_dir().join(format!("tessera-chat-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("train.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"c\"}]}\n",
    )
    .unwrap();
    let (conversations, docs) = read_conversations(&file).unwrap();
    assert_eq!(conversations.len(), 2);
    assert_eq!(conversations[1].name, "train.jsonl:3");
    assert_eq!(docs.docs.len(), 2);
    std::fs::write(
        &file,
        "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": 1}\n",
    )
    .unwrap();
    let e = read_conversations(&file).unwrap_err().to_string();
    assert!(e.contains("train.jsonl") && e.contains("line 2"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn chatml_renders_and_the_assistant_spans_are_its_answers_and_turn_ends() {
    let t = chatml();
    let c = conversation();
    let (text, spans) = t.render_spans(&c, LossOn::Assistant).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n\
         <|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\nAnother?<|im_end|>\n\
         <|im_start|>assistant\nRed.<|im_end|>\n"
    );
    let said: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
    assert_eq!(said, ["Blue.<|im_end|>\n", "Red.<|im_end|>\n"]);
    assert_eq!(
        t.render(&c[..2], true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let (all, spans) = t.render_spans(&c, LossOn::All).unwrap();
    assert_eq!(spans, vec![0..all.len()]);
}

#[test]
fn hugging_face_template_idioms_render() {
    // Python string methods, loop variables, namespace, raise_exception, trim/lstrip blocks.
    let source = "{{ bos_token }}{% for message in messages %}\n\
        {% if message['role'] not in ['user', 'assistant', 'system'] %}\
        {{ raise_exception('unknown role ' + message['role']) }}{% endif %}\n\
        {{ '<|' + message['role'] + '|>' + message['content'].strip() | upper }}\
        {% if loop.last %}{{ eos_token }}{% endif %}\n\
        {% endfor %}";
    let t = ChatTemplate::new(source, "test", "<s>", "</s>").unwrap();
    let text = t
        .render(&[msg("user", "  hi "), msg("assistant", "yo")], false)
        .unwrap();
    // A filter binds tighter than `+`, as in Jinja2.
    assert_eq!(text, "<s><|user|>HI<|assistant|>YO</s>");
    let e = t.render(&[msg("tool", "x")], false).unwrap_err();
    assert!(e.contains("unknown role tool"), "{e}");
    let e = ChatTemplate::new("{% for %}", "broken.jinja", "", "").unwrap_err();
    assert!(
        e.contains("broken.jinja") && e.contains("does not compile"),
        "{e}"
    );
}

#[test]
fn a_template_that_is_not_prefix_stable_is_refused_for_assistant_loss() {
    // The message count up front changes with every prefix.
    let source = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}";
    let t = ChatTemplate::new(source, "counting.jinja", "", "").unwrap();
    let e = t
        .render_spans(
            &[msg("user", "a"), msg("assistant", "b")],
            LossOn::Assistant,
        )
        .unwrap_err();
    assert!(
        e.contains("prefix by prefix") && e.contains("loss_on"),
        "{e}"
    );
    assert!(t
        .render_spans(&[msg("user", "a"), msg("assistant", "b")], LossOn::All)
        .is_ok());
}

fn tokenizer(dir: &Path, template: &ChatTemplate) -> TextTokenizer {
    let texts: Vec<String> = (0..20)
        .map(|_| template.render(&conversation(), false).unwrap())
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let json = train_bpe(&refs, 300).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json).unwrap();
    TextTokenizer::load(&path).unwrap()
}

#[test]
fn scored_tokens_are_exactly_the_assistant_text() {
    let dir = std::env::temp_dir().join(format!("tessera-chat-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for template in [
        chatml(),
        ChatTemplate::new(PLAIN, "plain", "", "<|endoftext|>").unwrap(),
    ] {
        let tok = tokenizer(&dir, &template);
        let c = Conversation {
            name: "x:1".to_owned(),
            messages: conversation(),
        };
        let t = tokenize_conversation(&template, &tok, &c, LossOn::Assistant).unwrap();
        assert_eq!(t.ids.len(), t.scored.len());
        // The scored tokens, decoded run by run, are the assistant's turns.
        let mut runs = Vec::new();
        let mut run: Vec<u32> = Vec::new();
        for (&id, &s) in t.ids.iter().zip(&t.scored) {
            if s {
                run.push(id);
            } else if !run.is_empty() {
                runs.push(tok.decode(&run).unwrap());
                run.clear();
            }
        }
        if !run.is_empty() {
            runs.push(tok.decode(&run).unwrap());
        }
        let (text, spans) = template
            .render_spans(&c.messages, LossOn::Assistant)
            .unwrap();
        let want: Vec<String> = spans.iter().map(|s| text[s.clone()].to_owned()).collect();
        // A byte-level token may carry the space before an answer (`Assistant: Blue`).
        assert_eq!(runs.len(), want.len(), "{runs:?} vs {want:?}");
        // Exactly the span, or the span with the space before it that the answer's first
        // token carries.
        for (got, want) in runs.iter().zip(&want) {
            assert!(
                got == want || *got == format!(" {want}"),
                "{}: {got:?} vs {want:?}",
                template.origin
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tokens(ids: &[u32], scored: &[bool]) -> ChatTokens {
    ChatTokens {
        ids: ids.to_vec(),
        scored: scored.to_vec(),
    }
}

#[test]
fn padded_and_packed_sequences_shift_targets_and_ignore_the_rest() {
    let a = tokens(&[1, 2, 3, 4], &[false, false, true, true]);
    let b = tokens(
        &[5, 6, 7, 8, 9, 10],
        &[false, true, true, false, true, true],
    );
    let padded =
        ChatSequences::new(vec![a.clone(), b.clone()], ChatLayout::Padded, 4, 0, -100).unwrap();
    assert_eq!(padded.len(), 2);
    assert_eq!(padded.truncated(), 1);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    padded.write(0, &mut x, &mut y);
    padded.write(1, &mut x, &mut y);
    assert_eq!(x, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(y, [-100, 3, 4, -100, 6, 7, -100, 9]);
    assert_eq!(padded.scored_targets(), 5);
    let packed = ChatSequences::new(vec![a, b], ChatLayout::Packed, 3, 0, -100).unwrap();
    // 10 tokens: sequences [0..4), [3..7), [6..10) of the stream.
    assert_eq!(packed.len(), 3);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for i in 0..3 {
        packed.write(i, &mut x, &mut y);
    }
    assert_eq!(x, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(y, [-100, 3, 4, -100, 6, 7, -100, 9, 10]);
    // A conversation whose answer lies beyond the cut is left out (its loss would be a mean
    // over nothing); with nothing left, an error.
    let late = tokens(
        &[1, 2, 3, 4, 5, 6],
        &[false, false, false, false, false, true],
    );
    let kept = ChatSequences::new(
        vec![late.clone(), tokens(&[7, 8], &[false, true])],
        ChatLayout::Padded,
        3,
        0,
        -100,
    )
    .unwrap();
    assert_eq!((kept.len(), kept.dropped()), (1, 1));
    let (mut x, mut y) = (Vec::new(), Vec::new());
    kept.write(0, &mut x, &mut y);
    assert_eq!((x, y), (vec![7, 8, 0], vec![8, -100, -100]));
    let e = ChatSequences::new(vec![late], ChatLayout::Padded, 4, 0, -100).unwrap_err();
    assert!(
        e.to_string()
            .contains("no sequence of 4 tokens with a scored target"),
        "{e}"
    );
}
