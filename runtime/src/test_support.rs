//! Helpers the crate's unit tests share.

use libcontainer::oci_spec::runtime::Spec;

/// The default spec with exactly `annotations`.
pub(crate) fn spec_with_annotations(annotations: &[(&str, &str)]) -> Spec {
    let mut spec = Spec::default();
    spec.set_annotations(Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    ));
    spec
}
