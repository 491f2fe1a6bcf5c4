from cycler_cli.main import main

main()
