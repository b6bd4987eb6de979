from repro.entry import main

main()
