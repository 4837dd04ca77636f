//! What a transform returns: edits of its input rather than a new batch, so that columns the
//! transform did not touch never cross the boundary back (the host keeps them, zero-copy).

use crate::bitmap::Bitmap;
use crate::column::Column;

/// Which input rows a transform keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// One bit per input row, least significant bit first; 1 keeps the row.
    Mask(Bitmap),
    /// Ascending row indices.
    Indices(Vec<u32>),
}

impl Selection {
    /// Keeps the rows whose bit is set.
    pub fn mask(mask: Bitmap) -> Self {
        Self::Mask(mask)
    }

    /// Keeps the rows at `indices`, which must be ascending.
    pub fn indices(indices: Vec<u32>) -> Self {
        Self::Indices(indices)
    }

    /// Keeps row `i` of `rows` when `keep(i)`: the per-row convenience loop, run inside the plugin
    /// and packed straight into a mask.
    pub fn from_fn(rows: usize, keep: impl FnMut(usize) -> bool) -> Self {
        Self::Mask(Bitmap::from_fn(rows, keep))
    }
}

/// A transform's result as edits of its input: the cheap path.
///
/// Built with [`Output::edit`]; converts into an [`Output`] with `.into()`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Edit {
    /// Columns to add, or to replace where the name exists; each has the input's row count.
    pub set_columns: Vec<Column>,
    /// Names of input columns to leave out of the output.
    pub drop_columns: Vec<String>,
    /// Rows to keep, applied after the column edits; `None` keeps every row.
    pub keep: Option<Selection>,
}

impl Edit {
    /// Adds `column`, or replaces the input column of the same name in place.
    #[must_use]
    pub fn set_column(mut self, column: Column) -> Self {
        self.set_columns.push(column);
        self
    }

    /// Leaves the input column `name` out of the output.
    #[must_use]
    pub fn drop_column(mut self, name: impl Into<String>) -> Self {
        self.drop_columns.push(name.into());
        self
    }

    /// Keeps only the `selection`ed rows (after the column edits).
    #[must_use]
    pub fn keep(mut self, selection: Selection) -> Self {
        self.keep = Some(selection);
        self
    }
}

/// What [`crate::Transform::process`] returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Edits of the input batch.
    Edit(Edit),
    /// A whole new batch as an Arrow IPC stream (for plugins that carry their own Arrow library).
    Ipc(Vec<u8>),
}

impl Output {
    /// The input batch, as it is.
    pub fn unchanged() -> Self {
        Self::Edit(Edit::default())
    }

    /// The input batch with only the `selection`ed rows.
    pub fn keep(selection: Selection) -> Self {
        Self::Edit(Edit::default().keep(selection))
    }

    /// Starts an edit: `Output::edit().set_column(c).drop_column("x").keep(sel).into()`.
    pub fn edit() -> Edit {
        Edit::default()
    }

    /// A whole new batch as Arrow IPC stream bytes.
    pub fn ipc(bytes: Vec<u8>) -> Self {
        Self::Ipc(bytes)
    }
}

impl From<Edit> for Output {
    fn from(edit: Edit) -> Self {
        Self::Edit(edit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_compose() {
        let out: Output = Output::edit()
            .set_column(Column::int64("x", vec![1], None))
            .drop_column("y")
            .keep(Selection::from_fn(3, |i| i != 1))
            .into();
        let Output::Edit(edit) = out else {
            panic!("expected an edit");
        };
        assert_eq!(edit.set_columns.len(), 1);
        assert_eq!(edit.drop_columns, ["y"]);
        assert_eq!(
            edit.keep,
            Some(Selection::Mask(Bitmap::from_bools(&[true, false, true])))
        );
        assert_eq!(Output::unchanged(), Output::Edit(Edit::default()));
    }
}
