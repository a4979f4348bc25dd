//! A rank's records as a Chrome trace (the JSON object format: `traceEvents` and
//! `otherData`), which Perfetto and chrome://tracing open: the rank is the process (`pid`),
//! each thread, device and the requests in flight a track (`tid`), each call a complete
//! event (`ph` "X", `ts` and `dur` in microseconds on rank 0's clock since the profile's
//! origin), with its route, bytes, communicator, call site and request in `args`.

use std::io::{self, Write};

use super::clock::Alignment;
use super::ring::{Kind, Record, Route};

/// The track of a request between its start and its completion.
pub const REQUESTS_TID: i64 = 1;
/// Thread n's track.
pub const THREAD_TID: i64 = 10;
/// Device d's track (the pass's and a MeshComm's calls, which run per device).
pub const DEVICE_TID: i64 = 100_000;

/// What the trace says of its rank, besides the records.
pub struct Trace<'a> {
    pub pid: i64,
    /// The process's name on its track ("rank 0 (host)").
    pub process: &'a str,
    /// A JSON object: the trace's `otherData`.
    pub other_data: &'a str,
    pub alignment: Alignment,
}

/// The texts the records number.
pub struct Texts<'a> {
    pub names: &'a [&'a str],
    pub sites: &'a [&'a str],
    /// Threads by number, from 1.
    pub threads: &'a [String],
}

/// Writes `s` as a JSON string.
pub fn json_string(out: &mut impl Write, s: &str) -> io::Result<()> {
    out.write_all(b"\"")?;
    let mut from = 0;
    for (at, c) in s.char_indices() {
        let escaped: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            c if (c as u32) < 0x20 => None,
            _ => continue,
        };
        out.write_all(&s.as_bytes()[from..at])?;
        match escaped {
            Some(e) => out.write_all(e.as_bytes())?,
            None => write!(out, "\\u{:04x}", c as u32)?,
        }
        from = at + c.len_utf8();
    }
    out.write_all(&s.as_bytes()[from..])?;
    out.write_all(b"\"")
}

fn micros(ns: i64) -> String {
    format!("{:.3}", ns as f64 / 1000.0)
}

fn tid_of(record: &Record) -> i64 {
    match record.kind {
        Kind::Completed => REQUESTS_TID,
        _ if record.device >= 0 && matches!(record.route, Route::Pass | Route::MeshComm) => {
            DEVICE_TID + i64::from(record.device)
        }
        _ => THREAD_TID + record.thread as i64,
    }
}

fn metadata(out: &mut impl Write, pid: i64, tid: i64, what: &str, args: &str) -> io::Result<()> {
    write!(
        out,
        "{{\"ph\":\"M\",\"name\":\"{what}\",\"pid\":{pid},\"tid\":{tid},\"args\":{args}}}"
    )
}

fn name_arg(name: &str) -> io::Result<String> {
    let mut text = Vec::new();
    text.extend_from_slice(b"{\"name\":");
    json_string(&mut text, name)?;
    text.push(b'}');
    Ok(String::from_utf8(text).expect("JSON text is UTF-8"))
}

/// Writes the whole trace; returns the number of call events.
pub fn write(
    out: &mut impl Write,
    trace: &Trace,
    records: &[Record],
    texts: &Texts,
) -> io::Result<usize> {
    let pid = trace.pid;
    out.write_all(b"{\"displayTimeUnit\":\"ms\",\"otherData\":")?;
    out.write_all(trace.other_data.as_bytes())?;
    out.write_all(b",\"traceEvents\":[\n")?;
    metadata(out, pid, 0, "process_name", &name_arg(trace.process)?)?;
    out.write_all(b",\n")?;
    metadata(
        out,
        pid,
        0,
        "process_sort_index",
        &format!("{{\"sort_index\":{pid}}}"),
    )?;
    let mut tracks: Vec<i64> = records.iter().map(tid_of).collect();
    tracks.sort_unstable();
    tracks.dedup();
    for tid in tracks {
        let name = match tid {
            REQUESTS_TID => "requests in flight (start to completion)".to_string(),
            t if t >= DEVICE_TID => format!("device {}", t - DEVICE_TID),
            t => {
                let n = (t - THREAD_TID) as usize;
                let os = texts
                    .threads
                    .get(n.wrapping_sub(1))
                    .map_or("", |s| s.as_str());
                format!("thread {n} ({os})")
            }
        };
        out.write_all(b",\n")?;
        metadata(out, pid, tid, "thread_name", &name_arg(&name)?)?;
        out.write_all(b",\n")?;
        metadata(
            out,
            pid,
            tid,
            "thread_sort_index",
            &format!("{{\"sort_index\":{tid}}}"),
        )?;
    }
    let text = |texts: &[&str], i: usize| texts.get(i).copied().unwrap_or("").to_string();
    for record in records {
        let start = trace.alignment.aligned_ns(record.start);
        let end = trace.alignment.aligned_ns(record.end).max(start);
        out.write_all(b",\n{\"ph\":\"X\",\"name\":")?;
        json_string(out, &text(texts.names, record.name))?;
        write!(
            out,
            ",\"cat\":\"{}\",\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{},\"args\":{{\"route\":\"{}\",\"kind\":\"{}\",\"bytes\":{}",
            record.route.name(),
            tid_of(record),
            micros(start),
            micros(end - start),
            record.route.name(),
            record.kind.name(),
            record.bytes,
        )?;
        match record.route {
            Route::MeshComm => write!(out, ",\"meshcomm\":{}", -i64::from(record.comm_id) - 1)?,
            Route::Pass => {}
            Route::Jaxmpi | Route::Plugin => write!(out, ",\"comm\":\"{:#x}\"", record.group)?,
        }
        if record.device >= 0 {
            write!(out, ",\"device\":{}", record.device)?;
        }
        if record.site != 0 {
            out.write_all(b",\"site\":")?;
            json_string(out, &text(texts.sites, record.site))?;
        }
        if record.request != 0 {
            write!(out, ",\"request\":{}", record.request)?;
        }
        if record.kind == Kind::Completed {
            write!(
                out,
                ",\"waited_us\":{}",
                micros(record.waited.min(i64::MAX as u64) as i64)
            )?;
        }
        if record.failed {
            out.write_all(b",\"failed\":true")?;
        }
        out.write_all(b"}}")?;
    }
    out.write_all(b"\n]}\n")?;
    Ok(records.len())
}

#[cfg(test)]
mod tests {
    use super::super::clock::Sync;
    use super::*;

    #[test]
    fn strings_are_escaped_as_json_wants() {
        let mut out = Vec::new();
        json_string(&mut out, "a\"b\\c\nd\u{1}é").unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn records_become_complete_events_on_their_tracks() {
        let record = Record {
            start: 2_000,
            end: 3_500,
            waited: 0,
            bytes: 4096,
            group: 0x4400_0000,
            request: 0,
            comm_id: 1,
            device: -1,
            name: 1,
            site: 1,
            route: Route::Jaxmpi,
            kind: Kind::Call,
            failed: false,
            thread: 2,
        };
        let completed = Record {
            kind: Kind::Completed,
            request: 7,
            waited: 250,
            site: 0,
            ..record
        };
        let pass = Record {
            route: Route::Pass,
            device: 3,
            comm_id: 0,
            ..record
        };
        let trace = Trace {
            pid: 1,
            process: "rank 1",
            other_data: "{\"run\":\"x\"}",
            alignment: Alignment {
                origin_ns: 1_000,
                start: Sync::default(),
                end: None,
            },
        };
        let texts = Texts {
            names: &["", "allreduce"],
            sites: &["", "jit(f)/\"q\""],
            threads: &["main".to_string(), "xla".to_string()],
        };
        let mut out = Vec::new();
        let n = write(&mut out, &trace, &[record, completed, pass], &texts).unwrap();
        assert_eq!(n, 3);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"run\":\"x\"},\"traceEvents\":["
        );
        assert!(lines.contains(
            &"{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":12,\"args\":{\"name\":\"thread 2 (xla)\"}},"
        ));
        assert!(lines.contains(
            &"{\"ph\":\"X\",\"name\":\"allreduce\",\"cat\":\"jaxmpi\",\"pid\":1,\"tid\":12,\"ts\":1.000,\"dur\":1.500,\"args\":{\"route\":\"jaxmpi\",\"kind\":\"call\",\"bytes\":4096,\"comm\":\"0x44000000\",\"site\":\"jit(f)/\\\"q\\\"\"}},"
        ));
        assert!(lines.contains(
            &"{\"ph\":\"X\",\"name\":\"allreduce\",\"cat\":\"jaxmpi\",\"pid\":1,\"tid\":1,\"ts\":1.000,\"dur\":1.500,\"args\":{\"route\":\"jaxmpi\",\"kind\":\"in flight\",\"bytes\":4096,\"comm\":\"0x44000000\",\"request\":7,\"waited_us\":0.250}},"
        ));
        assert!(lines.contains(
            &"{\"ph\":\"X\",\"name\":\"allreduce\",\"cat\":\"pass\",\"pid\":1,\"tid\":100003,\"ts\":1.000,\"dur\":1.500,\"args\":{\"route\":\"pass\",\"kind\":\"call\",\"bytes\":4096,\"device\":3,\"site\":\"jit(f)/\\\"q\\\"\"}}"
        ));
        assert_eq!(lines.last(), Some(&"]}"));
    }
}
