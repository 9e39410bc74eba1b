//! Module scopes that exporters record beside node names.
//!
//! The TorchScript exporter writes a node's module path into its name
//! (`/model/layers.0/mlp/fc1/MatMul`); torch's dynamo exporter (`torch.onnx.export(dynamo=True)`,
//! the default since torch 2.9) names nodes after the FX node (`node_linear_3`) and keeps the
//! path in the node's `metadata_props` under `pkg.torch.onnx.name_scopes`: the `repr()` of a
//! Python list of cumulative module paths, root first, the node's own name last, e.g.
//! `['', 'model', 'model.layers.0', 'model.layers.0.mlp', 'linear_3']`. This module turns that
//! list into the TorchScript form (`/model/layers.0/mlp/linear_3`), so the layer finder and the
//! torch split spec read one format; a node without the entry keeps its name.

/// The metadata key dynamo writes.
pub(crate) const NAME_SCOPES_KEY: &str = "pkg.torch.onnx.name_scopes";

/// The `/`-separated scope path of a node from its `name_scopes` value, or `None` when the value
/// is not a list of strings (it is then ignored, as any unknown metadata is).
pub(crate) fn scope_path(name_scopes: &str) -> Option<String> {
    let entries = parse_string_list(name_scopes)?;
    let (own_name, modules) = entries.split_last()?;
    let mut path = String::new();
    let mut parent = "";
    for module in modules.iter().filter(|m| !m.is_empty()) {
        // Each entry extends the previous one by `.child`, where the child may hold dots itself
        // (`model` → `model.layers.0`: a ModuleList element, which does not run, leaves no entry
        // of its own). TorchScript names an nn.Sequential's element by its name in the
        // Sequential's parent (`/layers/layers.0`), so a child that starts with an index takes
        // its container's name: that is the numbered segment the layer finder looks for.
        let rest = module
            .strip_prefix(parent)
            .and_then(|rest| rest.strip_prefix('.'))
            .filter(|_| !parent.is_empty())
            .unwrap_or(module);
        let starts_with_index = rest
            .split('.')
            .next()
            .is_some_and(|atom| !atom.is_empty() && atom.bytes().all(|b| b.is_ascii_digit()));
        path.push('/');
        if starts_with_index && rest != module {
            path.push_str(parent.rsplit('.').next().unwrap_or(parent));
            path.push('.');
        }
        path.push_str(rest);
        parent = module;
    }
    path.push('/');
    path.push_str(own_name);
    Some(path)
}

/// Parses the `repr()` of a Python list of strings: `['a', "b's", '']`.
fn parse_string_list(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
    let mut items = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let Some(quote) = chars.next() else {
            return Some(items);
        };
        if quote != '\'' && quote != '"' {
            return None;
        }
        let mut item = String::new();
        loop {
            match chars.next()? {
                '\\' => item.push(chars.next()?),
                c if c == quote => break,
                c => item.push(c),
            }
        }
        items.push(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamo_scopes_become_torchscript_style_paths() {
        assert_eq!(
            scope_path("['', 'model', 'model.layers.0', 'model.layers.0.mlp', 'linear_3']")
                .as_deref(),
            Some("/model/layers.0/mlp/linear_3")
        );
        assert_eq!(
            scope_path("['', 'network', 'network.0', 'linear']").as_deref(),
            Some("/network/network.0/linear")
        );
        assert_eq!(
            scope_path("['', 'model', 'model.layers', 'model.layers.0', 'add_1']").as_deref(),
            Some("/model/layers/layers.0/add_1")
        );
        assert_eq!(scope_path("['add']").as_deref(), Some("/add"));
        assert_eq!(
            scope_path(r#"['', "it's", 'x']"#).as_deref(),
            Some("/it's/x")
        );
        assert_eq!(scope_path("not a list"), None);
        assert_eq!(scope_path("[1, 2]"), None);
        assert_eq!(scope_path("[]"), None);
    }
}
