"""qt_tokenize — the implementation of tools/tokenize: inputs (sources), tokenizer files (tok), chat
rendering with loss masks (chat), worker processes (worker), packing into windows (pack) and the shard
writer (shard). The command line is in cli.py; tools/README.md documents the tool and the shard format."""
