//! `--chat-template`: a Jinja file, or (as vLLM allows) the template itself on the command line. The
//! template is compiled at start-up so that a broken one stops the server there, not at the first
//! request.

use std::path::Path;

use deltaserve_text::ChatTemplate;

use crate::serve_flags::args::ArgsError;

/// The template source `value` stands for, compiled once to prove it parses.
pub fn load_chat_template(value: &str) -> Result<String, ArgsError> {
    let path = Path::new(value);
    let source = if path.is_file() {
        std::fs::read_to_string(path)
            .map_err(|e| ArgsError(format!("--chat-template {value}: cannot read it: {e}")))?
    } else if value.contains("{{") || value.contains("{%") {
        value.to_string()
    } else {
        return Err(ArgsError(format!(
            "--chat-template {value:?} is neither a file nor a Jinja template ({{{{ or {{%); SGLang's \
             built-in template names are not supported: give the template file"
        )));
    };
    ChatTemplate::new(&source).map_err(|e| {
        ArgsError(format!(
            "--chat-template {value}: the template does not compile: {e}"
        ))
    })?;
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_file_and_refusals() {
        let inline = "{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(load_chat_template(inline).unwrap(), inline);
        let path =
            std::env::temp_dir().join(format!("deltaserve-template-{}.jinja", std::process::id()));
        std::fs::write(&path, inline).unwrap();
        assert_eq!(load_chat_template(path.to_str().unwrap()).unwrap(), inline);
        std::fs::remove_file(&path).unwrap();
        let e = load_chat_template("chatml").unwrap_err().0;
        assert!(
            e.contains("--chat-template \"chatml\"") && e.contains("file"),
            "{e}"
        );
        let e = load_chat_template("{% for m in messages %}").unwrap_err().0;
        assert!(e.contains("does not compile"), "{e}");
    }
}
