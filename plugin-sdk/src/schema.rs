//! The schema types a plugin sees, mirrored from the WIT `field` and `data-type`
//! as plain Rust, so that plugin logic is written (and tested natively) without
//! any generated binding types.

/// The type of a column, as the host hands it to plugins.
///
/// Timestamps are UTC microseconds since the epoch (Spark's `TIMESTAMP`);
/// dates are days since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// Bit-packed booleans.
    Boolean,
    /// 32-bit signed integers.
    Int32,
    /// 64-bit signed integers.
    Int64,
    /// 64-bit floats.
    Float64,
    /// Exact decimals: an `i128` scaled by `10^scale`.
    Decimal128 {
        /// Total number of decimal digits.
        precision: u8,
        /// Digits after the decimal point.
        scale: i8,
    },
    /// UTF-8 strings.
    Utf8,
    /// UTC microseconds since 1970-01-01T00:00:00Z.
    TimestampMicros,
    /// Days since 1970-01-01.
    Date32,
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Boolean => f.write_str("boolean"),
            Self::Int32 => f.write_str("int32"),
            Self::Int64 => f.write_str("int64"),
            Self::Float64 => f.write_str("float64"),
            Self::Decimal128 { precision, scale } => write!(f, "decimal128({precision}, {scale})"),
            Self::Utf8 => f.write_str("utf8"),
            Self::TimestampMicros => f.write_str("timestamp-micros"),
            Self::Date32 => f.write_str("date32"),
        }
    }
}

/// One named, typed column of a schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Field {
    /// The column's name.
    pub name: String,
    /// The column's type.
    pub data_type: DataType,
    /// Whether the column may hold nulls.
    pub nullable: bool,
}

impl Field {
    /// A field named `name` of type `data_type`.
    pub fn new(name: impl Into<String>, data_type: DataType, nullable: bool) -> Self {
        Self {
            name: name.into(),
            data_type,
            nullable,
        }
    }
}

/// The ordered fields of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Schema {
    fields: Vec<Field>,
}

impl Schema {
    /// A schema of `fields`, in this order.
    pub fn new(fields: Vec<Field>) -> Self {
        Self { fields }
    }

    /// The fields, in column order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The fields, consuming the schema.
    pub fn into_fields(self) -> Vec<Field> {
        self.fields
    }

    /// Number of columns.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether the schema has no columns.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The position of the column named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// The field named `name`.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The field at position `index`.
    pub fn field_at(&self, index: usize) -> Option<&Field> {
        self.fields.get(index)
    }

    /// This schema with `field` added at the end, or replacing the field of the same name in place
    /// (what the host does with a transform's `set_column`).
    #[must_use]
    pub fn with_field(mut self, field: Field) -> Self {
        match self.fields.iter_mut().find(|f| f.name == field.name) {
            Some(existing) => *existing = field,
            None => self.fields.push(field),
        }
        self
    }

    /// This schema without the field named `name` (unchanged when there is none).
    #[must_use]
    pub fn without_field(mut self, name: &str) -> Self {
        self.fields.retain(|f| f.name != name);
        self
    }
}

impl From<Vec<Field>> for Schema {
    fn from(fields: Vec<Field>) -> Self {
        Self::new(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_field_replaces_in_place_and_appends_new_names() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, true),
        ]);
        let schema = schema
            .with_field(Field::new("a", DataType::Float64, true))
            .with_field(Field::new("c", DataType::Date32, true))
            .without_field("b");
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(
            schema.field("a").map(|f| f.data_type),
            Some(DataType::Float64)
        );
        assert_eq!(schema.index_of("c"), Some(1));
    }

    #[test]
    fn data_type_display_matches_wit_names() {
        let d = DataType::Decimal128 {
            precision: 12,
            scale: 2,
        };
        assert_eq!(d.to_string(), "decimal128(12, 2)");
        assert_eq!(DataType::TimestampMicros.to_string(), "timestamp-micros");
    }
}
