//! Protocol Buffers' wire format, just enough to edit XLA's `HloModuleProto` without its
//! schema: a message is its fields in order, each kept as it came, so every field this
//! crate never names (XLA adds some each release) is written back byte for byte.

use std::fmt;

/// A malformed message: where parsing stopped and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One field's value, by wire type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Varint(u64),
    Fixed64(u64),
    /// Length-delimited: a string, bytes, a sub-message or a packed repeated field.
    Bytes(Vec<u8>),
    Fixed32(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub number: u32,
    pub value: Value,
}

/// A message as its fields in wire order (repeated fields are several entries).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    pub fields: Vec<Field>,
}

fn read_varint(bytes: &[u8], at: &mut usize) -> Result<u64, WireError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes
            .get(*at)
            .ok_or_else(|| WireError(format!("varint cut short at byte {at}")))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err(WireError(format!(
        "varint longer than 10 bytes before byte {at}"
    )))
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take<'a>(bytes: &'a [u8], at: &mut usize, len: usize) -> Result<&'a [u8], WireError> {
    let end = at
        .checked_add(len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| {
            WireError(format!(
                "field of {len} bytes at byte {at} runs past the end"
            ))
        })?;
    let slice = &bytes[*at..end];
    *at = end;
    Ok(slice)
}

impl Message {
    pub fn parse(bytes: &[u8]) -> Result<Message, WireError> {
        let mut fields = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let key = read_varint(bytes, &mut at)?;
            let number = u32::try_from(key >> 3)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| WireError(format!("bad field number in key {key:#x}")))?;
            let value = match key & 7 {
                0 => Value::Varint(read_varint(bytes, &mut at)?),
                1 => Value::Fixed64(u64::from_le_bytes(
                    take(bytes, &mut at, 8)?.try_into().unwrap_or_default(),
                )),
                2 => {
                    let len = read_varint(bytes, &mut at)? as usize;
                    Value::Bytes(take(bytes, &mut at, len)?.to_vec())
                }
                5 => Value::Fixed32(u32::from_le_bytes(
                    take(bytes, &mut at, 4)?.try_into().unwrap_or_default(),
                )),
                other => return Err(WireError(format!("wire type {other} of field {number}"))),
            };
            fields.push(Field { number, value });
        }
        Ok(Message { fields })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        for field in &self.fields {
            let key = u64::from(field.number) << 3;
            match &field.value {
                Value::Varint(v) => {
                    write_varint(out, key);
                    write_varint(out, *v);
                }
                Value::Fixed64(v) => {
                    write_varint(out, key | 1);
                    out.extend_from_slice(&v.to_le_bytes());
                }
                Value::Bytes(bytes) => {
                    write_varint(out, key | 2);
                    write_varint(out, bytes.len() as u64);
                    out.extend_from_slice(bytes);
                }
                Value::Fixed32(v) => {
                    write_varint(out, key | 5);
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }

    pub fn has(&self, number: u32) -> bool {
        self.fields.iter().any(|f| f.number == number)
    }

    /// A singular varint field (proto3: the last occurrence wins; absent is 0).
    pub fn varint(&self, number: u32) -> u64 {
        self.fields
            .iter()
            .rev()
            .find_map(|f| match (f.number == number, &f.value) {
                (true, Value::Varint(v)) => Some(*v),
                _ => None,
            })
            .unwrap_or(0)
    }

    pub fn int(&self, number: u32) -> i64 {
        self.varint(number) as i64
    }

    pub fn bool(&self, number: u32) -> bool {
        self.varint(number) != 0
    }

    /// A repeated integer field, packed or not (parsers must accept both).
    pub fn ints(&self, number: u32) -> Result<Vec<i64>, WireError> {
        let mut values = Vec::new();
        for field in self.fields.iter().filter(|f| f.number == number) {
            match &field.value {
                Value::Varint(v) => values.push(*v as i64),
                Value::Bytes(packed) => {
                    let mut at = 0;
                    while at < packed.len() {
                        values.push(read_varint(packed, &mut at)? as i64);
                    }
                }
                other => {
                    return Err(WireError(format!(
                        "field {number} should hold integers, holds {other:?}"
                    )))
                }
            }
        }
        Ok(values)
    }

    /// The bytes of every length-delimited occurrence of `number`, in order.
    pub fn all_bytes(&self, number: u32) -> impl Iterator<Item = &[u8]> {
        self.fields.iter().filter_map(move |f| match &f.value {
            Value::Bytes(bytes) if f.number == number => Some(bytes.as_slice()),
            _ => None,
        })
    }

    pub fn bytes(&self, number: u32) -> Option<&[u8]> {
        self.all_bytes(number).last()
    }

    pub fn string(&self, number: u32) -> String {
        self.bytes(number)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }

    pub fn message(&self, number: u32) -> Result<Option<Message>, WireError> {
        self.bytes(number).map(Message::parse).transpose()
    }

    pub fn messages(&self, number: u32) -> Result<Vec<Message>, WireError> {
        self.all_bytes(number).map(Message::parse).collect()
    }

    pub fn remove(&mut self, number: u32) {
        self.fields.retain(|f| f.number != number);
    }

    pub fn push(&mut self, number: u32, value: Value) {
        self.fields.push(Field { number, value });
    }

    /// Replaces every occurrence of `number` by one field holding `value`, where the first
    /// one was (so the order of the rest is kept), or at the end.
    pub fn set(&mut self, number: u32, value: Value) {
        match self.fields.iter().position(|f| f.number == number) {
            Some(at) => {
                self.fields[at].value = value;
                let mut i = 0;
                self.fields.retain(|f| {
                    i += 1;
                    f.number != number || i - 1 == at
                });
            }
            None => self.push(number, value),
        }
    }

    pub fn set_int(&mut self, number: u32, value: i64) {
        self.set(number, Value::Varint(value as u64));
    }

    pub fn set_string(&mut self, number: u32, value: &str) {
        self.set(number, Value::Bytes(value.as_bytes().to_vec()));
    }

    pub fn set_message(&mut self, number: u32, value: &Message) {
        self.set(number, Value::Bytes(value.encode()));
    }

    /// A repeated integer field, written packed (proto3's default).
    pub fn set_ints(&mut self, number: u32, values: &[i64]) {
        let mut packed = Vec::new();
        for &v in values {
            write_varint(&mut packed, v as u64);
        }
        self.remove(number);
        if !values.is_empty() {
            self.push(number, Value::Bytes(packed));
        }
    }

    pub fn push_message(&mut self, number: u32, value: &Message) {
        self.push(number, Value::Bytes(value.encode()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_written_back_byte_for_byte() {
        let mut inner = Message::default();
        inner.set_string(1, "x");
        inner.set_ints(3, &[4, -1, 300]);
        let mut outer = Message::default();
        outer.set_int(9, -5);
        outer.push_message(2, &inner);
        outer.push(7, Value::Fixed64(1 << 40));
        outer.push(8, Value::Fixed32(7));
        let bytes = outer.encode();
        let parsed = Message::parse(&bytes).unwrap();
        assert_eq!(parsed, outer);
        assert_eq!(parsed.encode(), bytes);
        assert_eq!(parsed.int(9), -5);
        let inner = parsed.message(2).unwrap().unwrap();
        assert_eq!(inner.ints(3).unwrap(), vec![4, -1, 300]);
        assert_eq!(inner.string(1), "x");
    }

    #[test]
    fn unpacked_repeated_integers_are_read_too() {
        let mut m = Message::default();
        m.push(5, Value::Varint(1));
        m.push(5, Value::Varint(2));
        assert_eq!(m.ints(5).unwrap(), vec![1, 2]);
    }

    #[test]
    fn set_keeps_the_first_position_and_drops_the_rest() {
        let mut m = Message::default();
        m.set_int(1, 1);
        m.set_int(2, 2);
        m.push(1, Value::Varint(3));
        m.set_int(1, 9);
        assert_eq!(m.fields.len(), 2);
        assert_eq!(m.fields[0].number, 1);
        assert_eq!(m.int(1), 9);
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let mut m = Message::default();
        m.set_string(1, "hello");
        let bytes = m.encode();
        for cut in 1..bytes.len() {
            assert!(Message::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
