//! The parts of XLA's HLO protos (`xla/service/hlo.proto`, `xla/xla_data.proto`) the pass
//! reads or writes, by field number, read off the descriptors inside jaxlib 0.10.2 and
//! 0.12. Everything else in a message travels through untouched (`wire.rs`).

use super::wire::{Message, Value, WireError};

pub mod module {
    pub const COMPUTATIONS: u32 = 3;
    pub const ENTRY_COMPUTATION_ID: u32 = 6;
    pub const SCHEDULE: u32 = 7;
    /// `HloInputOutputAliasProto`: its `entries` (field 1) pair results with parameters.
    pub const INPUT_OUTPUT_ALIAS: u32 = 8;
    /// `BufferDonorProto`: its `entries` (field 1) are parameters XLA may give a result.
    pub const BUFFER_DONOR: u32 = 18;
    pub const DEVICE_ASSIGNMENT: u32 = 15;
}

pub mod computation {
    pub const NAME: u32 = 1;
    pub const INSTRUCTIONS: u32 = 2;
    pub const PROGRAM_SHAPE: u32 = 4;
    pub const ID: u32 = 5;
    pub const ROOT_ID: u32 = 6;
}

pub mod instruction {
    pub const NAME: u32 = 1;
    pub const OPCODE: u32 = 2;
    pub const SHAPE: u32 = 3;
    pub const METADATA: u32 = 7;
    pub const PARAMETER_NUMBER: u32 = 9;
    pub const TUPLE_INDEX: u32 = 13;
    pub const DIMENSIONS: u32 = 14;
    pub const SLICE_DIMENSIONS: u32 = 17;
    pub const CHANNEL_ID: u32 = 26;
    pub const CUSTOM_CALL_TARGET: u32 = 28;
    pub const ID: u32 = 35;
    pub const OPERAND_IDS: u32 = 36;
    pub const CONTROL_PREDECESSOR_IDS: u32 = 37;
    pub const CALLED_COMPUTATION_IDS: u32 = 38;
    pub const BACKEND_CONFIG: u32 = 43;
    pub const REPLICA_GROUPS: u32 = 49;
    pub const SOURCE_TARGET_PAIRS: u32 = 52;
    pub const CUSTOM_CALL_HAS_SIDE_EFFECT: u32 = 65;
    pub const USE_GLOBAL_DEVICE_IDS: u32 = 71;
    pub const OUTPUT_OPERAND_ALIASING: u32 = 74;
    pub const CUSTOM_CALL_API_VERSION: u32 = 77;
    pub const COLLECTIVE_DEVICE_LIST: u32 = 87;
    pub const IOTA_COLLECTIVE_DEVICE_LIST: u32 = 92;
    pub const MESH_AXES_REPLICA_GROUP_LIST: u32 = 93;
}

/// `CustomCallApiVersion::API_VERSION_TYPED_FFI`.
pub const API_VERSION_TYPED_FFI: i64 = 4;

pub mod shape {
    pub const ELEMENT_TYPE: u32 = 2;
    pub const DIMENSIONS: u32 = 3;
    pub const TUPLE_SHAPES: u32 = 4;
    pub const LAYOUT: u32 = 5;
    /// `LayoutProto.minor_to_major`.
    pub const MINOR_TO_MAJOR: u32 = 1;
    pub const TUPLE: i64 = 13;
    pub const TOKEN: i64 = 17;
}

pub mod program_shape {
    pub const PARAMETERS: u32 = 1;
    pub const RESULT: u32 = 2;
}

pub mod metadata {
    pub const OP_NAME: u32 = 2;
}

/// `HloInstructionProto.SliceDimensions`: one dimension's `[start, limit)` and stride.
pub mod slice {
    pub const START: u32 = 1;
    pub const LIMIT: u32 = 2;
    pub const STRIDE: u32 = 3;
}

/// `OutputOperandAliasing`.
pub mod aliasing {
    pub const OUTPUT_SHAPE_INDEX: u32 = 1;
    pub const OPERAND_INDEX: u32 = 2;
}

/// A `ShapeProto`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape(pub Message);

impl Shape {
    pub fn element_type(&self) -> i64 {
        self.0.int(shape::ELEMENT_TYPE)
    }

    pub fn is_tuple(&self) -> bool {
        self.element_type() == shape::TUPLE
    }

    pub fn is_token(&self) -> bool {
        self.element_type() == shape::TOKEN
    }

    pub fn dims(&self) -> Result<Vec<i64>, WireError> {
        self.0.ints(shape::DIMENSIONS)
    }

    pub fn elements(&self) -> Result<Vec<Shape>, WireError> {
        Ok(self
            .0
            .messages(shape::TUPLE_SHAPES)?
            .into_iter()
            .map(Shape)
            .collect())
    }

    /// Dimension numbers from the most major to the most minor (no layout: row-major).
    pub fn major_to_minor(&self) -> Result<Vec<usize>, WireError> {
        let rank = self.dims()?.len();
        let layout = self.0.message(shape::LAYOUT)?;
        let minor_to_major = match layout {
            Some(layout) => layout.ints(shape::MINOR_TO_MAJOR)?,
            None => Vec::new(),
        };
        if minor_to_major.len() != rank {
            return Ok((0..rank).collect());
        }
        Ok(minor_to_major.iter().rev().map(|&d| d as usize).collect())
    }

    pub fn token() -> Shape {
        let mut m = Message::default();
        m.set_int(shape::ELEMENT_TYPE, shape::TOKEN);
        Shape(m)
    }

    pub fn tuple(elements: &[Shape]) -> Shape {
        let mut m = Message::default();
        m.set_int(shape::ELEMENT_TYPE, shape::TUPLE);
        for element in elements {
            m.push_message(shape::TUPLE_SHAPES, &element.0);
        }
        Shape(m)
    }

    /// This tuple shape with `extra` appended.
    pub fn appended(&self, extra: &Shape) -> Result<Shape, WireError> {
        let mut elements = self.elements()?;
        elements.push(extra.clone());
        Ok(Shape::tuple(&elements))
    }
}

/// An `HloInstructionProto`.
#[derive(Clone, Debug)]
pub struct Instruction(pub Message);

impl Instruction {
    pub fn id(&self) -> i64 {
        self.0.int(instruction::ID)
    }

    pub fn name(&self) -> String {
        self.0.string(instruction::NAME)
    }

    pub fn opcode(&self) -> String {
        self.0.string(instruction::OPCODE)
    }

    pub fn shape(&self) -> Result<Shape, WireError> {
        Ok(Shape(
            self.0.message(instruction::SHAPE)?.unwrap_or_default(),
        ))
    }

    pub fn set_shape(&mut self, shape: &Shape) {
        self.0.set_message(instruction::SHAPE, &shape.0);
    }

    pub fn operands(&self) -> Result<Vec<i64>, WireError> {
        self.0.ints(instruction::OPERAND_IDS)
    }

    pub fn set_operands(&mut self, ids: &[i64]) {
        self.0.set_ints(instruction::OPERAND_IDS, ids);
    }

    pub fn called(&self) -> Result<Vec<i64>, WireError> {
        self.0.ints(instruction::CALLED_COMPUTATION_IDS)
    }

    pub fn target(&self) -> String {
        self.0.string(instruction::CUSTOM_CALL_TARGET)
    }

    /// The JAX operation it came from, as JAX names it (`jit(step)/shard_map/psum`).
    pub fn op_name(&self) -> String {
        match self.0.message(instruction::METADATA) {
            Ok(Some(metadata)) => metadata.string(metadata::OP_NAME),
            _ => String::new(),
        }
    }

    /// A new instruction: its id, name, opcode, shape and operands.
    pub fn new(id: i64, name: &str, opcode: &str, shape: &Shape, operands: &[i64]) -> Self {
        let mut m = Message::default();
        m.set_string(instruction::NAME, name);
        m.set_string(instruction::OPCODE, opcode);
        m.set_message(instruction::SHAPE, &shape.0);
        m.set_int(instruction::ID, id);
        m.set_ints(instruction::OPERAND_IDS, operands);
        Instruction(m)
    }

    pub fn get_tuple_element(id: i64, name: &str, shape: &Shape, of: i64, index: usize) -> Self {
        let mut gte = Instruction::new(id, name, "get-tuple-element", shape, &[of]);
        gte.0.set_int(instruction::TUPLE_INDEX, index as i64);
        gte
    }

    /// Copies the JAX metadata of `from` (so errors and profiles name the JAX operation).
    pub fn with_metadata_of(mut self, from: &Instruction) -> Self {
        if let Some(metadata) = from.0.bytes(instruction::METADATA) {
            self.0
                .set(instruction::METADATA, Value::Bytes(metadata.to_vec()));
        }
        self
    }
}

/// An `HloComputationProto`, its instructions apart.
#[derive(Clone, Debug)]
pub struct Computation {
    /// Every field but the instructions.
    pub rest: Message,
    /// Where in `rest` the instructions go back (before the field at this index).
    at: usize,
    pub instructions: Vec<Instruction>,
}

impl Computation {
    pub fn parse(bytes: &[u8]) -> Result<Computation, WireError> {
        let mut rest = Message::parse(bytes)?;
        let at = rest
            .fields
            .iter()
            .position(|f| f.number == computation::INSTRUCTIONS)
            .unwrap_or(rest.fields.len());
        let instructions = rest
            .messages(computation::INSTRUCTIONS)?
            .into_iter()
            .map(Instruction)
            .collect();
        rest.remove(computation::INSTRUCTIONS);
        Ok(Computation {
            rest,
            at,
            instructions,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut whole = Message {
            fields: self.rest.fields[..self.at].to_vec(),
        };
        for instruction in &self.instructions {
            whole.push_message(computation::INSTRUCTIONS, &instruction.0);
        }
        whole.fields.extend_from_slice(&self.rest.fields[self.at..]);
        whole.encode()
    }

    pub fn id(&self) -> i64 {
        self.rest.int(computation::ID)
    }

    pub fn name(&self) -> String {
        self.rest.string(computation::NAME)
    }

    pub fn root_id(&self) -> i64 {
        self.rest.int(computation::ROOT_ID)
    }

    pub fn set_root_id(&mut self, id: i64) {
        self.rest.set_int(computation::ROOT_ID, id);
    }

    /// Sets the shape of parameter 0 and the result in the program shape.
    pub fn set_program_shape(
        &mut self,
        parameter: Option<&Shape>,
        result: Option<&Shape>,
    ) -> Result<(), WireError> {
        let mut program = self
            .rest
            .message(computation::PROGRAM_SHAPE)?
            .unwrap_or_default();
        if let Some(parameter) = parameter {
            let mut parameters = program.messages(program_shape::PARAMETERS)?;
            if parameters.is_empty() {
                parameters.push(Message::default());
            }
            parameters[0] = parameter.0.clone();
            program.remove(program_shape::PARAMETERS);
            for p in &parameters {
                program.push_message(program_shape::PARAMETERS, p);
            }
        }
        if let Some(result) = result {
            program.set_message(program_shape::RESULT, &result.0);
        }
        self.rest.set_message(computation::PROGRAM_SHAPE, &program);
        Ok(())
    }
}
