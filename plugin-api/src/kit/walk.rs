//! Finding modules in a module tree ([`crate::kit::SurgeryModel::modules`]).

use crate::ModuleInfo;

/// The module at `path`.
pub fn find<'a>(modules: &'a [ModuleInfo], path: &str) -> Option<&'a ModuleInfo> {
    modules.iter().find(|m| m.path.as_str() == path)
}

/// The modules of `kind`, in tree order.
pub fn of_kind<'a>(
    modules: &'a [ModuleInfo],
    kind: &'a str,
) -> impl Iterator<Item = &'a ModuleInfo> + 'a {
    modules.iter().filter(move |m| m.kind.as_str() == kind)
}

/// Whether `path` is `ancestor` or lies below it (`layer1.0.conv1` is inside `layer1`, not
/// inside `layer`).
pub fn is_within(path: &str, ancestor: &str) -> bool {
    ancestor.is_empty()
        || path == ancestor
        || path
            .strip_prefix(ancestor)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Whether `path` is, or lies inside, a module of `kind`: a surgery's own modules and what
/// they hold are left alone, so applying it twice changes nothing.
pub fn inside_kind(modules: &[ModuleInfo], path: &str, kind: &str) -> bool {
    of_kind(modules, kind).any(|m| is_within(path, m.path.as_str()))
}

/// The full name of `name` below `path` (`layer1.0` and `conv1`: `layer1.0.conv1`; below the
/// root, `name` itself): a child module's path or a module's tensor.
pub fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// The parent path of `path` (`""` for a child of the root), `None` for the root.
pub fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    Some(path.rsplit_once('.').map_or("", |(p, _)| p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_is_by_whole_path_segments() {
        assert!(is_within("layer1.0.conv1", "layer1"));
        assert!(is_within("layer1", "layer1"));
        assert!(!is_within("layer10", "layer1"));
        assert!(is_within("anything", ""));
        assert_eq!(parent("layer1.0.conv1"), Some("layer1.0"));
        assert_eq!(parent("fc"), Some(""));
        assert_eq!(parent(""), None);
        assert_eq!(child("layer1.0", "conv1"), "layer1.0.conv1");
        assert_eq!(child("", "fc"), "fc");
    }
}
