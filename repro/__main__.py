from repro.cli.entry import main

main()
