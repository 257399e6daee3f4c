use super::*;

fn store(name: &str) -> Store {
    Store::open(&format!("memory://{name}/base/dir")).unwrap()
}

#[test]
fn urls_are_told_from_paths() {
    assert!(is_url("S3://b/x"));
    assert!(is_url("gs://b"));
    assert!(is_url("az://c/p"));
    assert!(!is_url("relative/dir"));
    assert!(!is_url("http://example/x"));
    let e = Store::open("s3:///nobucket").unwrap_err().to_string();
    assert!(e.contains("no bucket"), "{e}");
    let e = Store::open("ftp://b/x").unwrap_err().to_string();
    assert!(e.contains("unknown scheme 'ftp'"), "{e}");
    let e = Store::open("memory://b/a/../x").unwrap_err().to_string();
    assert!(e.contains("'..'"), "{e}");
}

#[test]
fn names_are_relative_to_the_prefix() {
    let s = store("relative");
    assert_eq!(s.url(), "memory://relative/base/dir");
    s.put("chk-1/a", b"1".to_vec()).unwrap();
    s.put("chk-1/b", b"22".to_vec()).unwrap();
    s.put("chk-2/_metadata", b"333".to_vec()).unwrap();
    s.put("shared/x.sst", b"4444".to_vec()).unwrap();
    // Outside the prefix: never listed.
    Store::open("memory://relative/base/dirt")
        .unwrap()
        .put("z", vec![1])
        .unwrap();
    let all: Vec<(String, u64)> = s
        .list("")
        .unwrap()
        .into_iter()
        .map(|o| (o.name, o.size))
        .collect();
    assert_eq!(
        all,
        [
            ("chk-1/a".to_string(), 1),
            ("chk-1/b".to_string(), 2),
            ("chk-2/_metadata".to_string(), 3),
            ("shared/x.sst".to_string(), 4)
        ]
    );
    let one: Vec<String> = s
        .list("chk-1/")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(one, ["chk-1/a", "chk-1/b"]);
    let partial: Vec<String> = s
        .list("chk-")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(partial, ["chk-1/a", "chk-1/b", "chk-2/_metadata"]);
    assert_eq!(s.list_dirs("").unwrap(), ["chk-1", "chk-2", "shared"]);
    let child = s.child("chk-1");
    assert_eq!(child.url(), "memory://relative/base/dir/chk-1");
    assert_eq!(child.get("b").unwrap().unwrap(), b"22");
    assert_eq!(s.head("chk-2/_metadata").unwrap().unwrap().size, 3);
    assert_eq!(s.head("nothing").unwrap(), None);
    s.delete("chk-1/a").unwrap();
    s.delete("chk-1/a").unwrap();
    assert_eq!(s.list("chk-1/").unwrap().len(), 1);
}

#[test]
fn files_upload_and_download_streamed_with_their_checksum() {
    let s = store("files");
    let tmp = std::env::temp_dir().join(format!("weir-objstore-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for len in [0usize, 1000, PART_SIZE, PART_SIZE * 2 + 12345] {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let path = tmp.join("src");
        std::fs::write(&path, &bytes).unwrap();
        let name = format!("f-{len}");
        let (size, crc) = s.put_file(&name, &path).unwrap();
        assert_eq!((size, crc), (len as u64, crc32fast::hash(&bytes)));
        assert_eq!(s.checksum(&name).unwrap(), Some((size, crc)));
        let back = tmp.join("back");
        assert_eq!(s.download(&name, &back).unwrap(), Some((size, crc)));
        assert_eq!(std::fs::read(&back).unwrap(), bytes);
    }
    assert_eq!(s.checksum("missing").unwrap(), None);
    assert_eq!(s.download("missing", &tmp.join("m")).unwrap(), None);
    assert!(!tmp.join("m").exists());
    let e = s
        .put_file("x", &tmp.join("does-not-exist"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot read") && e.contains("does-not-exist"),
        "{e}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_multipart_upload_appears_whole_when_completed_and_never_when_aborted() {
    let s = store("multipart");
    let id = s.create_upload("out/part-0").unwrap();
    let p0 = s.put_part("out/part-0", &id, 0, vec![1; 10]).unwrap();
    let p1 = s.put_part("out/part-0", &id, 1, vec![2; 5]).unwrap();
    assert_eq!(s.get("out/part-0").unwrap(), None);
    s.complete_upload("out/part-0", &id, vec![p0, p1]).unwrap();
    let mut want = vec![1; 10];
    want.extend([2; 5]);
    assert_eq!(s.get("out/part-0").unwrap().unwrap(), want);

    let id = s.create_upload("out/part-1").unwrap();
    s.put_part("out/part-1", &id, 0, vec![1; 10]).unwrap();
    s.abort_upload("out/part-1", &id).unwrap();
    assert_eq!(s.get("out/part-1").unwrap(), None);
}

#[test]
fn an_unreachable_endpoint_is_named_with_what_to_check() {
    set_options([
        ("aws_endpoint_url", "http://127.0.0.1:1"),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", "k"),
        ("aws_secret_access_key", "hidden-secret"),
        ("aws_region", "us-east-1"),
        ("weir_object_store_retry_secs", "0.5"),
    ]);
    let s = Store::open("s3://bucket/prefix").unwrap();
    let e = s.get("x").unwrap_err().to_string();
    set_options(Vec::<(String, String)>::new());
    assert!(e.starts_with("cannot read s3://bucket/prefix/x: "), "{e}");
    assert!(e.contains("the endpoint cannot be reached"), "{e}");
    assert!(!e.contains("hidden-secret"), "{e}");
}

#[test]
fn aborting_an_upload_the_store_no_longer_knows_is_no_error() {
    let s = store("abort-twice");
    let id = s.create_upload("out/part-0").unwrap();
    let p0 = s.put_part("out/part-0", &id, 0, vec![1; 3]).unwrap();
    s.complete_upload("out/part-0", &id, vec![p0]).unwrap();
    s.abort_upload("out/part-0", &id).unwrap();
    assert_eq!(s.get("out/part-0").unwrap().unwrap(), vec![1; 3]);
    let id = s.create_upload("out/part-1").unwrap();
    s.abort_upload("out/part-1", &id).unwrap();
    s.abort_upload("out/part-1", &id).unwrap();
}

#[test]
fn copies_stay_on_the_server() {
    let s = store("copy");
    s.put("a/one", b"contents".to_vec()).unwrap();
    s.copy("a/one", "b/two").unwrap();
    assert_eq!(s.get("b/two").unwrap().unwrap(), b"contents");
    assert_eq!(s.get("a/one").unwrap().unwrap(), b"contents");
    let e = s.copy("missing", "c").unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
}
