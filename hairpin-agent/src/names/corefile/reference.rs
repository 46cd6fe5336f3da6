//! A much simpler reading of a Corefile's braces, to check the editor against: words
//! split on whitespace, `#` to the end of the line a comment, a `{` or `}` word, or
//! a word ending in `{` last on its line, a brace. It is right only for text without
//! quotes, CR or a BOM, the only text it is used on. Shared by the property tests
//! (`names/proptests.rs`) and the Corefile fuzz target (through the crate: hidden
//! from its docs, never called by the agent).

/// Brace depth at the start of each line, or `None` when unbalanced.
pub fn reference_depths(corefile: &str) -> Option<Vec<usize>> {
    let mut depth: usize = 0;
    let mut out = Vec::new();
    for line in corefile.split('\n') {
        out.push(depth);
        let code = line.split('#').next().unwrap_or("");
        let words: Vec<&str> = code.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            if *w == "{" || (w.len() > 1 && w.ends_with('{') && i + 1 == words.len()) {
                depth += 1;
            } else if *w == "}" {
                depth = depth.checked_sub(1)?;
            }
        }
    }
    (depth == 0).then_some(out)
}
