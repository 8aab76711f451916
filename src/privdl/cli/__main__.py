from privdl.cli import main

main()
