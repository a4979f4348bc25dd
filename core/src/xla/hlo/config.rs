//! A custom call's attributes as XLA:CPU reads them from `backend_config`: an MLIR
//! dictionary in text, the form JAX's own FFI lowerings produce (`{comm = 5 : i64, counts =
//! dense<[1, 2]> : tensor<2xi64>}`), which XLA parses into the FFI attributes the handler
//! decodes (`frame/attributes.rs`).

use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Default)]
pub struct Config {
    // MLIR sorts a dictionary's entries by name; so does this, for stable output.
    entries: BTreeMap<&'static str, String>,
}

impl Config {
    pub fn int(mut self, name: &'static str, value: i64) -> Self {
        self.entries.insert(name, format!("{value} : i64"));
        self
    }

    pub fn ints(mut self, name: &'static str, values: &[i64]) -> Self {
        let list: Vec<String> = values.iter().map(i64::to_string).collect();
        let text = if values.is_empty() {
            "dense<> : tensor<0xi64>".to_string()
        } else {
            format!(
                "dense<[{}]> : tensor<{}xi64>",
                list.join(", "),
                values.len()
            )
        };
        self.entries.insert(name, text);
        self
    }

    pub fn text(mut self, name: &'static str, value: &str) -> Self {
        let mut quoted = String::from("\"");
        for byte in value.bytes() {
            match byte {
                b'"' | b'\\' => {
                    quoted.push('\\');
                    quoted.push(byte as char);
                }
                0x20..=0x7e => quoted.push(byte as char),
                other => {
                    let _ = write!(quoted, "\\{other:02X}");
                }
            }
        }
        quoted.push('"');
        self.entries.insert(name, quoted);
        self
    }

    pub fn render(&self) -> String {
        let items: Vec<String> = self
            .entries
            .iter()
            .map(|(name, value)| format!("{name} = {value}"))
            .collect();
        format!("{{{}}}", items.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_as_jax_lowerings_do() {
        let config = Config::default()
            .int("op", 0)
            .ints("groups", &[2, 0, 1])
            .ints("outer", &[])
            .text("origin", "jit(f)/psum \"x\"\n");
        assert_eq!(
            config.render(),
            "{groups = dense<[2, 0, 1]> : tensor<3xi64>, op = 0 : i64, origin = \
             \"jit(f)/psum \\\"x\\\"\\0A\", outer = dense<> : tensor<0xi64>}"
        );
    }
}
