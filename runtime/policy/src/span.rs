//! Map between key paths (`network.allow[2]`) and positions in a TOML text, so that
//! errors found after deserialising still name the file, line and key.

use std::fmt;
use std::ops::Range;

use toml_edit::{ImDocument, Item, Value};

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A path to a value inside a policy document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPath(pub Vec<Segment>);

impl KeyPath {
    pub fn new(root: &str) -> KeyPath {
        KeyPath(vec![Segment::Key(root.to_owned())])
    }

    pub fn key(&self, key: &str) -> KeyPath {
        let mut path = self.clone();
        path.0.push(Segment::Key(key.to_owned()));
        path
    }

    pub fn index(&self, index: usize) -> KeyPath {
        let mut path = self.clone();
        path.0.push(Segment::Index(index));
        path
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(k) if i == 0 => f.write_str(k)?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
        before.get(nl + 1..).map_or(0, |s| s.chars().count())
    }) + 1;
    (line, column)
}

#[derive(Clone, Copy)]
enum Node<'a> {
    Table(&'a toml_edit::Table),
    Tables(&'a toml_edit::ArrayOfTables),
    Value(&'a Value),
    Empty,
}

impl<'a> Node<'a> {
    fn from_item(item: &'a Item) -> Node<'a> {
        match item {
            Item::Table(t) => Node::Table(t),
            Item::ArrayOfTables(a) => Node::Tables(a),
            Item::Value(v) => Node::Value(v),
            Item::None => Node::Empty,
        }
    }

    fn span(&self) -> Option<Range<usize>> {
        match self {
            Node::Table(t) => t.span(),
            Node::Tables(a) => a.span(),
            Node::Value(v) => v.span(),
            Node::Empty => None,
        }
    }

    /// The child named by `segment`, with the span of its key when it has one.
    fn child(&self, segment: &Segment) -> Option<(Node<'a>, Option<Range<usize>>)> {
        match (*self, segment) {
            (Node::Table(t), Segment::Key(k)) => {
                let (key, item) = t.get_key_value(k)?;
                Some((Node::from_item(item), key.span()))
            }
            (Node::Tables(a), Segment::Index(n)) => {
                let table = a.get(*n)?;
                Some((Node::Table(table), None))
            }
            (Node::Value(Value::InlineTable(t)), Segment::Key(k)) => {
                let (key, item) = t.get_key_value(k)?;
                Some((Node::from_item(item), key.span()))
            }
            (Node::Value(Value::Array(a)), Segment::Index(n)) => {
                Some((Node::Value(a.get(*n)?), None))
            }
            _ => None,
        }
    }

    fn segments(&self) -> Vec<Segment> {
        match *self {
            Node::Table(t) => t.iter().map(|(k, _)| Segment::Key(k.to_owned())).collect(),
            Node::Value(Value::InlineTable(t)) => {
                t.iter().map(|(k, _)| Segment::Key(k.to_owned())).collect()
            }
            Node::Tables(a) => (0..a.len()).map(Segment::Index).collect(),
            Node::Value(Value::Array(a)) => (0..a.len()).map(Segment::Index).collect(),
            _ => Vec::new(),
        }
    }
}

/// The byte offset where `path` (or its nearest existing ancestor) starts in `text`.
pub fn offset_of(text: &str, path: &KeyPath) -> usize {
    let Ok(doc) = ImDocument::parse(text) else {
        return 0;
    };
    let mut node = Node::from_item(doc.as_item());
    let mut best = 0;
    for segment in &path.0 {
        match node.child(segment) {
            Some((child, key_span)) => {
                if let Some(span) = key_span.or_else(|| child.span()) {
                    best = span.start;
                }
                node = child;
            }
            // The key is absent (a default applies): the nearest ancestor is the best place.
            None => break,
        }
    }
    best
}

/// The key path of the innermost value whose span contains `offset`. For a text that is
/// not valid TOML, the last table header before `offset`.
pub fn path_at(text: &str, offset: usize) -> KeyPath {
    let mut path = KeyPath::default();
    let Ok(doc) = ImDocument::parse(text) else {
        let before = text.get(..offset.min(text.len())).unwrap_or(text);
        let header = before.lines().rev().find_map(|line| {
            let name = line.trim().strip_prefix('[')?.split(']').next()?;
            Some(name.trim_matches(|c| c == '[' || c == ' ').to_owned())
        });
        if let Some(name) = header {
            path.0.push(Segment::Key(name));
        }
        return path;
    };
    let mut node = Node::from_item(doc.as_item());
    loop {
        let mut next = None;
        for segment in node.segments() {
            let Some((child, key_span)) = node.child(&segment) else {
                continue;
            };
            let contains = |span: &Option<Range<usize>>| {
                span.as_ref()
                    .is_some_and(|s| s.start <= offset && offset <= s.end)
            };
            if contains(&child.span()) || contains(&key_span) {
                next = Some((segment, child));
                break;
            }
        }
        if next.is_none() {
            next = array_of_tables_at(&node, offset);
        }
        match next {
            Some((segment, child)) => {
                path.0.push(segment);
                node = child;
            }
            None => return path,
        }
    }
}

/// Tables given by headers (`[a]`, `[[a.b]]`) span only their header line, so an offset in
/// their body is in no span. As in TOML itself, the body belongs to the last header before the
/// offset: descend towards it.
fn array_of_tables_at<'a>(node: &Node<'a>, offset: usize) -> Option<(Segment, Node<'a>)> {
    match *node {
        Node::Table(t) => t
            .iter()
            .filter_map(|(k, item)| {
                let start = last_header_before(item, offset)?;
                Some((start, Segment::Key(k.to_owned()), Node::from_item(item)))
            })
            .max_by_key(|(start, _, _)| *start)
            .map(|(_, segment, child)| (segment, child)),
        Node::Tables(a) => (0..a.len())
            .filter_map(|i| {
                let table = a.get(i)?;
                let start = last_header_in_table(table, offset)?;
                Some((start, Segment::Index(i), Node::Table(table)))
            })
            .max_by_key(|(start, _, _)| *start)
            .map(|(_, segment, child)| (segment, child)),
        _ => None,
    }
}

fn last_header_in_table(t: &toml_edit::Table, offset: usize) -> Option<usize> {
    let own = t.span().map(|s| s.start).filter(|&s| s <= offset);
    let nested = t
        .iter()
        .filter_map(|(_, item)| last_header_before(item, offset))
        .max();
    own.max(nested)
}

fn last_header_before(item: &Item, offset: usize) -> Option<usize> {
    match item {
        Item::Table(t) => last_header_in_table(t, offset),
        Item::ArrayOfTables(a) => a
            .iter()
            .filter_map(|t| last_header_in_table(t, offset))
            .max(),
        _ => None,
    }
}

/// Refine an error located at an array to the element it is about: the first string
/// element that `message` quotes (our value errors quote the offending value as `x`).
/// Returns the element's path and start offset.
pub fn refine_to_element(text: &str, path: &KeyPath, message: &str) -> Option<(KeyPath, usize)> {
    let doc = ImDocument::parse(text).ok()?;
    let mut node = Node::from_item(doc.as_item());
    for segment in &path.0 {
        node = node.child(segment)?.0;
    }
    let Node::Value(Value::Array(array)) = node else {
        return None;
    };
    array.iter().enumerate().find_map(|(i, value)| {
        let s = value.as_str()?;
        message
            .contains(&format!("`{s}`"))
            .then(|| (path.index(i), value.span().map_or(0, |r| r.start)))
    })
}
